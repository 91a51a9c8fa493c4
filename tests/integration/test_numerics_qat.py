"""quantweave.compare after QAT: prepare_qat_pt2e -> training steps -> eval -> convert_pt2e,
compared with the trained prepared model run in float (issue 14)."""

import copy

import pytest
import torch
from torch import nn
from torch.ao.quantization.fake_quantize import disable_fake_quant, disable_observer

import quantweave as qw
from quantweave.testing.inspect import sqnr
from quantweave_x86 import X86InductorQuantizer, get_default_x86_inductor_quantization_config
from quantweave_xnnpack import XNNPACKQuantizer, get_symmetric_quantization_config


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


QUANTIZERS = {
    "x86": lambda: X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True)),
    "xnnpack": lambda: XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_qat=True)
    ),
}


def _data(count: int = 4) -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, 8, 8, generator=gen),) for _ in range(count)]


def _qat(name):
    torch.manual_seed(0)
    data = _data()
    exported = torch.export.export(Net().train(), data[0]).module()
    quantizer = QUANTIZERS[name]()
    prepared = qw.prepare_qat_pt2e(exported, quantizer)
    optimizer = torch.optim.SGD(prepared.parameters(), lr=1e-2)
    for batch in data * 2:
        loss = prepared(*batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    qw.move_exported_model_to_eval(prepared)
    return exported, quantizer, prepared, qw.convert_pt2e(prepared), data


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_compare_after_qat_matches_every_op_against_the_trained_float_model(name):
    _, quantizer, prepared, converted, data = _qat(name)
    state = {k: v.clone() for k, v in prepared.state_dict().items()}
    report = qw.compare(prepared, converted, data)

    assert report.unmatched == ()
    by_node = report.by_node()
    # the QAT conv + batch norm pattern was folded by convert: the conv stands for the batch norm
    assert by_node["conv2d"].compared_with == "batch_norm"
    assert {"conv2d", "conv2d_1", "linear"} <= set(by_node)
    # the trained weights, not the exported ones: the model-level SQNR at the output is the
    # end-to-end SQNR against the prepared model with its fake-quantizers off
    float_view = copy.deepcopy(prepared)
    float_view.apply(disable_fake_quant)
    float_view.apply(disable_observer)
    with torch.no_grad():
        reference = torch.cat([float_view(*b) for b in data])
        got = torch.cat([converted(*b) for b in data])
    assert by_node["linear"].cumulative_sqnr_db == pytest.approx(float(sqnr(reference, got)), abs=1e-3)
    assert all(op.sqnr_db > 10 for op in report.ops)
    # the caller's prepared model is untouched: same state, still fake-quantizing
    assert all(torch.equal(state[k], v) for k, v in prepared.state_dict().items())
    with torch.no_grad():
        assert not torch.equal(prepared(*data[0]), float_view(*data[0]))

    # the annotation report takes it too
    rows = qw.annotation_report(prepared, quantizer, numerics=report)
    assert next(r for r in rows.nodes if r.node == "conv2d").numerics is by_node["conv2d"]


def test_the_untrained_training_mode_export_is_not_what_to_compare_with():
    """The export given to prepare_qat_pt2e runs batch norm on batch statistics with the
    untrained weights: its conv is compared with itself (no eval batch norm to fold), which
    the docs say not to do; the prepared model is the reference after QAT."""
    exported, _, prepared, converted, data = _qat("x86")
    assert qw.compare(exported, converted, data).by_node()["conv2d"].compared_with == "conv2d"
    assert qw.compare(prepared, converted, data).by_node()["conv2d"].compared_with == "batch_norm"

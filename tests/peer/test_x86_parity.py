"""Peer parity for quantweave-x86 against torchao's X86InductorQuantizer (default config).

Same model, same calibration data, fresh exports: the converted models must have the same
quantize/dequantize decisions (scales, zero points, dtypes, ranges, per consumer) and
identical outputs.

Where we annotate more than the peer (listed, and asserted, below) the q/dq decisions do
not change on these models:
- unary ops after conv/linear written functionally (F.relu, F.gelu, ...) are fused by us
  and not by the peer, which finds them only through nn.Module source partitions; the
  fusion marks the unary node as the pattern's end and adds no quantize/dequantize;
- standalone conv1d (the peer quantizes conv1d only before an nn.ReLU) — not in these models.
"""

import pytest
import torch

import quantweave as qw
from quantweave.testing import models
from quantweave.testing.inspect import qdq_summary
from quantweave_x86 import X86InductorQuantizer
from tests.helpers import export

pytestmark = pytest.mark.peer
KEY = "quantization_annotation"


@pytest.fixture(scope="module")
def torchao_x86():
    xiq = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    return xiq


def claimed(gm):
    return {n.name for n in gm.graph.nodes if KEY in n.meta and n.meta[KEY]._annotated}


def both(model, dynamic, torchao_x86, torchao_flow):
    inputs = models.example_inputs(model)
    calibration = models.calibration_batches(model, 3)
    prepare_ao, convert_ao = torchao_flow
    ours = qw.prepare_pt2e(export(model, *inputs), X86InductorQuantizer(is_dynamic=dynamic))
    config = torchao_x86.get_default_x86_inductor_quantization_config(is_dynamic=dynamic)
    theirs = prepare_ao(export(model, *inputs), torchao_x86.X86InductorQuantizer().set_global(config))
    for batch in calibration:
        ours(*batch)
        theirs(*batch)
    extra = claimed(ours) - claimed(theirs)
    converted_ours, converted_theirs = qw.convert_pt2e(ours), convert_ao(theirs)
    return (
        (qdq_summary(converted_ours), converted_ours(*inputs)),
        (qdq_summary(converted_theirs), converted_theirs(*inputs)),
        extra,
    )


CASES = {
    "resnet18_like": (lambda: models.resnet18_like(width=8, num_classes=10), False, set()),
    "mobilenet_like": (lambda: models.MobileNetLike().eval(), False, {"relu_1"}),  # torch.relu in the SE gate
    "encoder_block": (lambda: models.encoder_block(), False, {"gelu"}),
    "encoder_block_dynamic": (lambda: models.encoder_block(), True, {"gelu"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_qparams_and_outputs_as_torchao(name, torchao_x86, torchao_flow):
    factory, dynamic, expected_extra = CASES[name]
    torch.manual_seed(0)
    (ours, out), (theirs, ref), extra = both(factory(), dynamic, torchao_x86, torchao_flow)
    assert extra == expected_extra, "nodes we claim and the peer does not"
    assert len(ours) > 3
    assert ours == theirs
    assert torch.equal(out, ref), f"max abs difference {(out - ref).abs().max().item()}"


# -- QAT -------------------------------------------------------------------------------------------

QAT_CASES = {
    "resnet18_like": lambda: models.resnet18_like(width=8, num_classes=10),
    "mobilenet_like": lambda: models.MobileNetLike(),
}


@pytest.mark.parametrize("name", sorted(QAT_CASES))
def test_qat_same_qparams_and_outputs_as_torchao(name, torchao_x86):
    """prepare_qat -> three training-mode forward passes (fake-quantizers and batch-norm
    statistics update) -> convert, on both sides. The peer rewrites conv + batch norm by
    pattern replacement, which renames the conv nodes, so the q/dq decisions are compared
    as a multiset (scale, zero point, axis, range, dtype per consumer edge) and the outputs
    exactly."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    torch.manual_seed(0)
    model = QAT_CASES[name]().train()
    inputs = (torch.randn(4, 3, 32, 32),)
    batches = [(torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(i)),) for i in range(3)]
    ours = qw.prepare_qat_pt2e(torch.export.export(model, inputs).module(), X86InductorQuantizer(is_qat=True))
    config = torchao_x86.get_default_x86_inductor_quantization_config(is_qat=True)
    theirs = prepare_qat_pt2e(
        torch.export.export(model, inputs).module(), torchao_x86.X86InductorQuantizer().set_global(config)
    )
    for batch in batches:
        ours(*batch)
        theirs(*batch)
    converted_ours, converted_theirs = qw.convert_pt2e(ours), convert_pt2e(theirs)
    summary_ours, summary_theirs = qdq_summary(converted_ours), qdq_summary(converted_theirs)
    assert len(summary_ours) > 10
    assert sorted(map(repr, summary_ours.values())) == sorted(map(repr, summary_theirs.values()))
    assert not any(n.target is torch.ops.aten.batch_norm.default for n in converted_ours.graph.nodes)
    out, ref = converted_ours(*inputs), converted_theirs(*inputs)
    assert torch.equal(out, ref), f"max abs difference {(out - ref).abs().max().item()}"

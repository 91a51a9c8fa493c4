"""quantweave.compare (per-op numeric debugger) and quantweave.fallback / LeaveFloat, on
synthetic data (the real-data proofs are in tests/accuracy)."""

import json
import math

import pytest
import torch
from torch import nn

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, annotate_output_qspec
from quantweave.float_fallback import fused_units
from quantweave.plugin_api import mark_annotated
from quantweave.testing.inspect import sqnr
from quantweave.testing.reference import make_reference_quantizer
from quantweave_x86 import X86InductorQuantizer
from quantweave_xnnpack import XNNPACKQuantizer, get_symmetric_quantization_config
from tests.helpers import assert_names, exported_once_fixtures

aten = torch.ops.aten


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.conv2(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def _net(outlier: float | None = None) -> Net:
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.bn1.running_mean.uniform_(-0.2, 0.2)
        net.bn1.running_var.uniform_(0.5, 1.5)
        net.bn1.weight.uniform_(0.5, 1.5)
        net.bn1.bias.fill_(0.3)  # every channel of relu1 mostly positive
        if outlier is not None:  # channel 0 of relu1 `outlier` times larger, compensated in conv2
            net.bn1.weight[0] *= outlier
            net.bn1.bias[0] *= outlier
            net.conv2.weight[:, 0] /= outlier
    return net


def _data(count: int = 4, seed: int = 1) -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 3, 8, 8, generator=gen),) for _ in range(count)]


def _quantize(exported, quantizer, data):
    prepared = qw.prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for batch in data:
            prepared(*batch)
    return qw.convert_pt2e(prepared)


def _xnnpack():
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


# the Net exported once for the module's tests (each used to export it again), checked unchanged
# before and after each test: a test that modified it fails there
_exported_once, exported = exported_once_fixtures("exported", _net, lambda: _data(1)[0])


QUANTIZERS = {
    "reference": lambda: make_reference_quantizer(),
    "x86": X86InductorQuantizer,
    "xnnpack": _xnnpack,
    "composed": lambda: qw.ComposableQuantizer([make_reference_quantizer(), X86InductorQuantizer()]),
}


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_every_quantized_op_is_matched_by_identity_and_reported_worst_first(exported, name):
    data = _data()
    converted = _quantize(exported, QUANTIZERS[name](), data)
    report = qw.compare(exported, converted, data)
    assert report.unmatched == ()
    assert report.batches == len(data)
    nodes = {op.node: op for op in report.ops}
    # the convs and the linear are quantized by every quantizer here, and keep their names
    assert {"conv2d", "conv2d_1", "linear"} <= set(nodes)
    float_names = {n.name: n for n in exported.graph.nodes}
    for op in report.ops:
        assert str(float_names[op.node].target) == op.op
        assert 15 < op.sqnr_db < math.inf, op
    # batch norm is folded into conv1 by prepare: conv1 is compared with the float batch norm
    assert float_names[nodes["conv2d"].compared_with].target in (
        aten.batch_norm.default,
        aten._native_batch_norm_legit_no_training.default,
    ) or nodes["conv2d"].compared_with.startswith("getitem")
    assert nodes["conv2d_1"].compared_with == "conv2d_1"
    assert nodes["conv2d"].module == "conv1" and nodes["linear"].module == "fc"
    assert [op.sqnr_db for op in report.ops] == sorted(op.sqnr_db for op in report.ops)


def test_the_first_op_s_own_error_is_the_model_error_there(exported):
    data = _data()
    report = qw.compare(exported, _quantize(exported, X86InductorQuantizer(), data), data)
    first = report.by_node()["conv2d"]  # its inputs are the model input and a constant
    assert first.sqnr_db == pytest.approx(first.cumulative_sqnr_db)
    assert first.max_abs_error == pytest.approx(first.cumulative_max_abs_error)
    # the last op's model error is the converted model's output error (errors pooled over batches)
    converted = _quantize(exported, X86InductorQuantizer(), data)
    with torch.no_grad():
        ref = torch.cat([exported(*b) for b in data]).double()
        out = torch.cat([converted(*b) for b in data]).double()
    expected = 10 * math.log10(float(ref.pow(2).sum()) / float((ref - out).pow(2).sum()))
    assert report.by_node()["linear"].cumulative_sqnr_db == pytest.approx(expected)


def test_an_outlier_channel_makes_its_consumer_the_worst_op():
    data = _data()
    exported = torch.export.export(_net(outlier=500.0), data[0]).module()
    for quantizer in (X86InductorQuantizer(), _xnnpack(), make_reference_quantizer()):
        report = qw.compare(exported, _quantize(exported, quantizer, data), data)
        assert report.ops[0].node == "conv2d_1", report.to_table()
        assert report.ops[0].module == "conv2"
        assert report.ops[0].sqnr_db < 10 < report.ops[1].sqnr_db


def test_table_json_and_join_with_the_annotation_report(exported):
    data = _data(2)
    quantizer = X86InductorQuantizer()
    prepared = qw.prepare_pt2e(exported, quantizer)
    for batch in data:
        prepared(*batch)
    report = qw.compare(exported, qw.convert_pt2e(prepared), data)
    table = report.to_table()
    assert "op SQNR dB" in table and "conv2d_1" in table and "worst first" in table.splitlines()[-1]
    decoded = json.loads(report.to_json())
    assert [op["node"] for op in decoded["ops"]] == [op.node for op in report.ops]
    rows = qw.numerics.join_annotation_report(report, qw.annotation_report(prepared, quantizer))
    assert [r["node"] for r in rows[: len(report.ops)]] == [
        op.node for op in report.ops if op.node in {r["node"] for r in rows}
    ]
    assert all(r["sqnr_db"] is not None for r in rows if r["status"] == "quantized" and r["node"] in report.by_node())


def test_unmatched_and_wrong_inputs_are_said():
    data = _data(1)
    exported = torch.export.export(_net(), data[0]).module()
    converted = _quantize(exported, X86InductorQuantizer(), data)
    other = torch.export.export(nn.Sequential(nn.Flatten(), nn.Linear(192, 4)).eval(), data[0]).module()
    report = qw.compare(other, converted, data)
    assert report.ops == ()  # its "linear" has another shape and module: not the same node
    unmatched = dict(report.unmatched)
    assert {"conv2d", "conv2d_1", "linear"} <= set(unmatched)
    assert "no node of this name" in unmatched["conv2d"] and "module" in unmatched["linear"]
    with pytest.raises(TypeError, match="GraphModule"):
        qw.compare(_net(), converted, data)
    with pytest.raises(ValueError, match="empty"):
        qw.compare(exported, converted, [])


# -- LeaveFloat and fallback ----------------------------------------------------------------------


def test_fused_units_follow_unquantized_edges():
    exported = torch.export.export(_net(), _data(1)[0]).module()  # its own: annotate writes into it
    X86InductorQuantizer().annotate(exported)
    units = fused_units(exported)
    assert units["conv2d_1"] == ("conv2d_1", "relu_1") == units["relu_1"]
    assert units["linear"] == ("linear",)


@pytest.mark.parametrize("name", ["x86", "xnnpack", "reference"])
def test_leave_float_removes_the_unit_and_the_report_says_why(exported, name):
    data = _data()
    quantizer = qw.LeaveFloat(QUANTIZERS[name](), ["conv2d_1"], reasons={"conv2d_1": "too noisy"})
    prepared = qw.prepare_pt2e(exported, quantizer)
    rows = {r.node: r for r in qw.annotation_report(prepared, quantizer).nodes}
    assert rows["conv2d_1"].status == "float" and "too noisy" in rows["conv2d_1"].reason
    for batch in data:
        prepared(*batch)
    converted = qw.convert_pt2e(prepared)
    conv2 = next(n for n in converted.graph.nodes if n.name == "conv2d_1")
    # float inputs: neither the activation nor the weight is dequantized
    assert not any("dequantize" in str(a.target) for a in conv2.all_input_nodes)
    assert "conv2d_1" not in qw.compare(exported, converted, data).by_node()


def test_leave_float_redirects_shared_specs_and_refuses_derived_ones():
    class Shares(qw.Quantizer):
        """conv1 quantizes its output; conv2's input shares it; fc's bias derives from conv2's."""

        def __init__(self, derived: bool) -> None:
            self.derived = derived

        def annotate(self, model):
            spec = qw.QuantizationSpec(
                dtype=torch.uint8,
                quant_min=0,
                quant_max=255,
                qscheme=torch.per_tensor_affine,
                observer_or_fake_quant_ctr=qw.observers.MinMaxObserver,
            )
            nodes = {n.name: n for n in model.graph.nodes}
            conv1, conv2 = nodes["conv2d"], nodes["conv2d_1"]
            annotate_output_qspec(conv1, spec)
            mark_annotated(conv1)
            relu = conv2.args[0]
            annotate_input_qspec_map(conv2, relu, qw.SharedQuantizationSpec(conv1))
            mark_annotated(conv2)
            if self.derived:
                annotate_input_qspec_map(
                    conv2,
                    conv2.args[1],
                    qw.DerivedQuantizationSpec(
                        derived_from=[conv1],
                        derive_qparams_fn=lambda obs: obs[0].calculate_qparams(),
                        dtype=torch.int32,
                    ),
                )
            return model

    exported = torch.export.export(_net(), _data(1)[0]).module()
    prepared = qw.prepare_pt2e(exported, qw.LeaveFloat(Shares(False), ["conv2d"], float_inputs=False))
    conv2 = next(n for n in prepared.graph.nodes if n.name == "conv2d_1")
    spec = conv2.meta["quantization_annotation"].input_qspec_map[conv2.args[0].args[0]]
    assert isinstance(spec, qw.QuantizationSpec)  # was SharedQuantizationSpec(conv1): now its own
    with pytest.raises(ValueError) as info:
        qw.prepare_pt2e(exported, qw.LeaveFloat(Shares(True), ["conv2d"]))
    assert_names(info, "DerivedQuantizationSpec", "'conv2d'")
    with pytest.raises(ValueError) as info:
        qw.prepare_pt2e(exported, qw.LeaveFloat(Shares(False), ["nope"]))
    assert_names(info, "LeaveFloat", "['nope']", "not in the graph")


def _sqnr_score(exported, data):
    with torch.no_grad():
        reference = [exported(*b) for b in data]

    def score(model) -> float:
        with torch.no_grad():
            return min(sqnr(r, model(*b)) for r, b in zip(reference, data, strict=True))

    return score


@pytest.mark.parametrize("name", ["x86", "xnnpack"])
def test_fallback_leaves_exactly_the_hostile_op_float(name):
    data = _data()
    exported = torch.export.export(_net(outlier=500.0), data[0]).module()
    score = _sqnr_score(exported, data)
    result = qw.fallback(exported, QUANTIZERS[name](), data, score, max_drop=math.inf)
    assert result.left_float == () and result.met  # any drop allowed: nothing left float
    # score: output SQNR against float, capped at 60 dB; allowed drop 40 dB (to 20 dB)
    result = qw.fallback(exported, QUANTIZERS[name](), data, lambda m: min(score(m), 60.0), max_drop=40.0)
    assert result.quantized_score < 20 <= result.score
    assert result.met and [u.nodes for u in result.left_float] == [("conv2d_1", "relu_1")]
    assert result.left_float[0].rank == 1 and "conv2d_1" in result.left_float[0].reason
    assert "conv2d_1" in result.summary() and json.loads(json.dumps(result.to_dict()))["met"] is True


def test_fallback_says_when_the_drop_cannot_be_met():
    data = _data()
    exported = torch.export.export(_net(outlier=500.0), data[0]).module()
    result = qw.fallback(
        exported, X86InductorQuantizer(), data, lambda m: 1.0 if m is exported else 0.0, 0.5, max_units=2
    )
    assert not result.met and len(result.left_float) == 2
    assert [u.rank for u in result.left_float] == [1, 2]
    with pytest.raises(TypeError, match="GraphModule"):
        qw.fallback(_net(), X86InductorQuantizer(), data, lambda m: 0.0, 0.1)
    with pytest.raises(ValueError, match="max_drop"):
        qw.fallback(exported, X86InductorQuantizer(), data, lambda m: 0.0, -1)


@pytest.mark.parametrize(
    ("quantizer", "fold"),
    [(X86InductorQuantizer(), False), (X86InductorQuantizer(is_dynamic=True), True)],
    ids=["weights-not-folded", "dynamic"],
)
def test_compare_reads_unfolded_weights_and_dynamic_quantization(exported, quantizer, fold):
    data = _data()
    prepared = qw.prepare_pt2e(exported, quantizer)
    for batch in data:
        prepared(*batch)
    report = qw.compare(exported, qw.convert_pt2e(prepared, fold_quantize=fold), data)
    assert report.unmatched == ()
    assert "linear" in report.by_node() and all(15 < op.sqnr_db < math.inf for op in report.ops)


def test_fallback_on_a_composition():
    data = _data()
    exported = torch.export.export(_net(outlier=500.0), data[0]).module()
    score = _sqnr_score(exported, data)
    composed = qw.ComposableQuantizer([make_reference_quantizer(), X86InductorQuantizer()])
    result = qw.fallback(exported, composed, data, lambda m: min(score(m), 60.0), max_drop=40.0)
    assert result.met and [u.nodes for u in result.left_float] == [("conv2d_1", "relu_1")]
    rows = {
        r.node: r
        for r in qw.annotation_report(qw.prepare_pt2e(exported, qw.LeaveFloat(composed, ["conv2d_1"])), composed).nodes
    }
    assert rows["conv2d_1"].status == "float" and rows["conv2d"].status == "quantized"

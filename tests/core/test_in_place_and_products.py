"""In-place ops annotated as their functional ops (prepare's copy and the kit), linears written
as matrix products (addmm / mm / matmul of a constant [in, out] weight), and the report's
compute ops left float."""

import pytest
import torch
from torch import nn

import quantweave as qw
from quantweave import authoring
from quantweave.authoring import Rule, RuleTable
from quantweave.observers import MinMaxObserver, PerChannelMinMaxObserver
from quantweave.plugin_api import Capability, Mode, Quant, QuantizerInfo, TensorQuant, is_annotated, mark_annotated
from quantweave.testing.conformance import check_capability
from quantweave.testing.reference import weight_spec
from quantweave.vocabulary import PatternSpec
from tests.helpers import Snapshot, export

aten = torch.ops.aten
ACT = qw.QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=MinMaxObserver)
ACT_TQ = TensorQuant("uint8", 0, 255, "per_tensor", symmetric=False)
#: int8 [-127, 127] per output channel (axis 0 of a linear's [out, in] weight)
WEIGHT = weight_spec(qw, PerChannelMinMaxObserver, narrow=True)


class Adds(qw.Quantizer):
    """Written on the authoring kit: quantizes aten.add.Tensor (the functional op) only."""

    name = "adds"

    def annotate(self, model):
        for node in model.graph.nodes:
            if authoring.calls(node, aten.add.Tensor) and not is_annotated(node):
                for x in node.args[:2]:
                    authoring.annotate_input_qspec_map(node, x, ACT)
                authoring.annotate_output_qspec(node, ACT)
                mark_annotated(node)
        return model

    def quantization_capabilities(self):
        return (
            Capability("add", Mode.STATIC, ACT_TQ, output=Quant.quantized(ACT_TQ)),
            Capability("add_in_place", Mode.STATIC, ACT_TQ, output=Quant.quantized(ACT_TQ)),
        )


class Residual(nn.Module):
    """torchvision's BasicBlock tail: ``out += identity`` then an in-place relu."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.fc(x)
        out += x
        return self.relu(out)


class SeenThroughAView(nn.Module):
    def forward(self, x):
        h = x * 2
        v = h.view(-1)  # taken before the write: sees it
        h += 1
        return v, h


class WritesItsInput(nn.Module):
    def forward(self, x, y):
        x.add_(y)
        return x * 1


def test_in_place_ops_are_annotated_as_their_functional_ops_on_the_copy_only():
    model = export(Residual(), torch.randn(2, 4))
    before = Snapshot.of(model)
    prepared = qw.prepare_pt2e(model, Adds())
    nodes = {n.name: n for n in prepared.graph.nodes}
    assert nodes["add_"].target == aten.add.Tensor and is_annotated(nodes["add_"])
    assert nodes["relu_"].target == aten.relu.default  # the relu reads the add's result
    assert Snapshot.of(model).differences(model) == [] and before.differences(model) == []
    assert aten.add_.Tensor in {n.target for n in model.graph.nodes}
    x = torch.randn(2, 4)
    torch.testing.assert_close(prepared(x.clone()), model(x.clone()))
    report = qw.annotation_report(prepared, Adds())
    assert {r.node: r.status for r in report.nodes}["add_"] == "quantized"


@pytest.mark.parametrize("model", [SeenThroughAView(), WritesItsInput()], ids=type)
def test_an_in_place_op_whose_write_is_seen_stays_in_place(model):
    inputs = (torch.randn(2, 4),) if isinstance(model, SeenThroughAView) else (torch.randn(4), torch.randn(4))
    prepared = qw.prepare_pt2e(export(model, *inputs), Adds())
    (add_,) = [n for n in prepared.graph.nodes if "add" in str(n.target)]
    assert add_.target == aten.add_.Tensor and not is_annotated(add_)
    x = [t.clone() for t in inputs]
    y = [t.clone() for t in inputs]
    torch.testing.assert_close(prepared(*x), model(*y))
    torch.testing.assert_close(x, y)  # the input written by both alike
    # no quantizer matched it: prepare says why it stays float, naming the op and what it writes
    reason = {r.node: r for r in qw.annotation_report(prepared, Adds()).nodes}["add_"].reason
    written = add_.args[0].name
    assert "aten.add_.Tensor" in reason and f"'{written}'" in reason and "out of place" in reason


def test_the_kit_checks_an_in_place_pattern_as_the_functional_one():
    """A contributed pattern whose probe writes ``x += y``: the kit (annotate_copy and the
    flow) sees the functional add, so a plugin matching only aten.add.Tensor conforms."""

    class InPlaceAdd(nn.Module):
        def forward(self, x, y):
            x = x * 1
            x += y
            return x

    spec = PatternSpec(
        "add_in_place",
        "x += y",
        ("aten.add.Tensor",),
        lambda: (InPlaceAdd(), (torch.randn(2, 8), torch.randn(2, 8))),
        origin="test",
    )
    info = QuantizerInfo("adds", Adds, capabilities=tuple(Adds().quantization_capabilities()))
    cap = next(c for c in info.capabilities if c.pattern == "add_in_place")
    assert check_capability(info, cap, "test", patterns={"add_in_place": spec}) == []


# -- linears written as matrix products --------------------------------------------------------


class Products(nn.Module):
    """GPT-2's Conv1D (addmm of an [in, out] weight), mm, x @ W, and a product of two activations."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 6))
        self.bias = nn.Parameter(torch.randn(6))
        self.w2 = nn.Parameter(torch.randn(6, 6))
        self.w3 = nn.Parameter(torch.randn(6, 4))

    def forward(self, x):
        h = torch.addmm(self.bias, x, self.weight)
        h = torch.mm(h, self.w2)
        out = h @ self.w3
        return out, torch.bmm(out[None], out.t()[None]), self.w3.t() @ h.t()


def test_weight_matmul_recognises_a_linear_written_as_a_product():
    gm = export(Products(), torch.randn(3, 8))
    found = {n.name: authoring.weight_matmul(n) for n in gm.graph.nodes if n.op == "call_function"}
    addmm = found["addmm"]
    assert addmm is not None and (addmm.x.name, addmm.weight.target, addmm.bias.target) == ("x", "weight", "bias")
    assert found["mm"] is not None and found["mm"].bias is None and found["mm"].weight.target == "w2"
    assert found["matmul"] is not None and found["matmul"].weight.target == "w3"
    assert found["matmul_1"] is None  # W.t() @ h.t(): the constant is not [in, out] on the right
    assert authoring.WEIGHT_AXIS == 1


def test_channel_axis_spec_moves_a_per_channel_weight_spec_to_the_out_axis():
    spec = qw.QuantizationSpec(
        dtype=torch.int8,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        observer_or_fake_quant_ctr=PerChannelMinMaxObserver,
    )
    moved = authoring.channel_axis_spec(spec)
    assert moved.ch_axis == 1 and spec.ch_axis == 0
    assert authoring.channel_axis_spec(None) is None


class AsLinear(qw.Quantizer):
    """A backend quantizing products with a constant weight as linears (weight on axis 1)."""

    name = "aslinear"

    def annotate(self, model):
        weight = authoring.channel_axis_spec(WEIGHT)  # [in, out]: output channels on axis 1
        for node in model.graph.nodes:
            found = authoring.weight_matmul(node)
            if found is not None:
                authoring.annotate_input_qspec_map(node, found.x, ACT)
                authoring.annotate_input_qspec_map(node, found.weight, weight)
                mark_annotated(node)
        return model


def test_products_as_linears_keeps_the_values_and_leaves_the_converted_model_alone():
    torch.manual_seed(0)
    model = export(Products(), torch.randn(3, 8))
    prepared = qw.prepare_pt2e(model, AsLinear())
    qw.calibrate(prepared, [(torch.randn(3, 8),) for _ in range(2)], progress=False)
    converted = qw.convert_pt2e(prepared)
    before = Snapshot.of(converted)
    dequantized = [n for n in converted.graph.nodes if "dequantize_per_channel" in str(n.target)]
    assert len(dequantized) == 3 and all(n.args[3] == 1 for n in dequantized)
    linears = authoring.products_as_linears(converted)
    assert (
        sorted(str(n.target) for n in linears.graph.nodes if "linear" in str(n.target)) == ["aten.linear.default"] * 3
    )
    assert before.differences(converted) == []
    x = torch.randn(3, 8)
    for got, want in zip(linears(x), converted(x), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert authoring.products_as_linears(model) is model  # nothing quantized to rewrite


def test_the_report_lists_every_compute_op_left_float_declared_or_not():
    prepared = qw.prepare_pt2e(export(Products(), torch.randn(3, 8)), AsLinear())
    rows = {r.node: r for r in qw.annotation_report(prepared, AsLinear()).nodes}
    assert {rows[n].status for n in ("addmm", "mm", "matmul")} == {"quantized"}
    assert rows["bmm"].status == "float" and rows["bmm"].kind == "undeclared", rows["bmm"]
    assert rows["matmul_1"].status == "float" and "aslinear" in rows["matmul_1"].reason
    assert "aten.bmm.default" in qw.report.COMPUTE_OPS and "aten.addmm.default" in qw.report.COMPUTE_OPS


def test_rule_table_rows_for_products_declare_the_weight_on_axis_1():
    table = RuleTable("t", [Rule("addmm", weighted=True), Rule("mm", weighted=True, bias=None)])
    weight = TensorQuant("int8", -127, 127, "per_channel", symmetric=True, ch_axis=authoring.WEIGHT_AXIS)
    caps = {c.pattern: c for c in table.capabilities(Mode.STATIC, ACT_TQ, weight)}
    assert caps["addmm"].weight.ch_axis == 1 and caps["mm"].bias is None
    assert table.ops_of("addmm") == ("aten.addmm.default",)


class Linears(qw.Quantizer):
    name = "linears"

    def annotate(self, model):
        weight = WEIGHT
        for node in model.graph.nodes:
            if authoring.calls(node, aten.linear.default):
                authoring.annotate_input_qspec_map(node, node.args[0], ACT)
                authoring.annotate_input_qspec_map(node, node.args[1], weight)
                mark_annotated(node)
        return model


def test_compare_measures_an_op_whose_output_a_later_in_place_op_writes():
    """The float model's relu_ writes the linear's output in place: compare keeps the linear's
    value as it was (the converted model's relu is functional), so its SQNR is the linear's."""

    class LinearReluInPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            return torch.relu_(self.fc(x))

    torch.manual_seed(0)
    x = torch.randn(8, 16)
    model = export(LinearReluInPlace(), x)
    prepared = qw.prepare_pt2e(model, Linears())
    qw.calibrate(prepared, [(x,)], progress=False)
    (op,) = qw.compare(model, qw.convert_pt2e(prepared), [(x,)]).ops
    assert op.node == "linear" and op.sqnr_db > 30, op

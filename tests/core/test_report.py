"""The annotation report: what was quantized, by whom, what stayed float and why."""

import json

import torch

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, annotate_output_qspec
from quantweave.compose import ComposableQuantizer
from quantweave.plugin_api import Capability, TensorQuant, mark_annotated, set_skip_reason
from quantweave.report import annotation_report
from tests.helpers import WEIGHTED_ACT as ACT
from tests.helpers import ConvMeanMlp as Model
from tests.helpers import Weighted, export

aten = torch.ops.aten


def test_report_names_quantizers_and_reasons():
    composed = ComposableQuantizer(
        [Weighted("convq", aten.conv2d.default), Weighted("linq", aten.linear.default, skip_module="fc2")]
    )
    prepared = qw.prepare_pt2e(export(Model(), torch.randn(1, 3, 8, 8)), composed)
    report = annotation_report(prepared, composed)
    rows = {r.node: r for r in report.nodes}
    assert (rows["conv2d"].status, rows["conv2d"].quantizer) == ("quantized", "convq")
    assert (rows["linear"].status, rows["linear"].quantizer) == ("quantized", "linq")
    assert (rows["linear_1"].status, rows["linear_1"].reason) == ("float", "module name 'fc2' configured None")
    assert rows["linear_1"].kind == "skipped"
    undeclared = ("float", "no member (convq, linq) declares a pattern with this op", "undeclared")
    assert (rows["sigmoid"].status, rows["sigmoid"].reason, rows["sigmoid"].kind) == undeclared
    assert (rows["mean"].status, rows["mean"].reason, rows["mean"].kind) == undeclared
    assert [r.node for r in report.nodes] == ["conv2d", "mean", "linear", "linear_1", "sigmoid"]

    table = report.to_table().splitlines()
    assert table[0].split() == ["node", "op", "status", "quantizer", "reason"]
    assert table[2].split()[:4] == ["conv2d", "aten.conv2d.default", "quantized", "convq"]
    assert table[-1] == "2 quantized (convq: 1, linq: 1), 3 float, of 5 compute nodes"

    data = json.loads(report.to_json())
    assert data["summary"] == {
        "quantized": 2,
        "float": 3,
        "by_quantizer": {"convq": 1, "linq": 1},
        "float_by_kind": {"skipped": 1, "undeclared": 2},
    }
    assert data["nodes"][3] == {
        "node": "linear_1",
        "op": "aten.linear.default",
        "status": "float",
        "quantizer": None,
        "reason": "module name 'fc2' configured None",
        "kind": "skipped",
    }


def test_report_with_a_single_quantizer_uses_its_label():
    quantizer = Weighted("solo", aten.linear.default)
    prepared = qw.prepare_pt2e(export(Model(), torch.randn(1, 3, 8, 8)), quantizer)
    report = annotation_report(prepared, quantizer)
    assert report.by_quantizer() == {"solo": 2}
    assert report.quantized == 2 and report.float == 3


def test_report_names_who_marked_a_node_and_why_another_was_skipped():
    class Marker(qw.Quantizer):
        name = "marker"

        def annotate(self, model):
            for node in model.graph.nodes:
                if node.target == aten.sigmoid.default:
                    annotate_output_qspec(node, ACT)
                    mark_annotated(node, by="sigmoid-unit")
                elif node.target == aten.linear.default:
                    set_skip_reason(node, "linear left to the host")
            return model

        def quantization_capabilities(self):
            # a pattern contributed by a plugin: its ops join what the report lists
            return (Capability("fc_chain", "static", TensorQuant("uint8", 0, 255), ops=("aten.linear.default",)),)

    quantizer = Marker()
    prepared = qw.prepare_pt2e(export(Model(), torch.randn(1, 3, 8, 8)), quantizer)
    rows = {r.node: r for r in annotation_report(prepared, quantizer).nodes}
    assert (rows["sigmoid"].status, rows["sigmoid"].quantizer) == ("quantized", "sigmoid-unit")
    assert (rows["linear"].status, rows["linear"].kind) == ("float", "not_applicable")
    assert rows["linear"].reason == "declared by marker (fc_chain) but not applicable here: linear left to the host"


def test_without_a_quantizer_the_report_cannot_say_who_declares_what():
    prepared = qw.prepare_pt2e(export(Model(), torch.randn(1, 3, 8, 8)), Weighted("convq", aten.conv2d.default))
    rows = {r.node: r for r in annotation_report(prepared).nodes}
    assert (rows["sigmoid"].reason, rows["sigmoid"].kind) == ("no quantizer claims this pattern", "undeclared")


class Declares(Weighted):
    """Declares its pattern; leaves the module ``skip_module`` float without recording why."""

    def annotate(self, model):
        for node in model.graph.nodes:
            stack = node.meta.get("nn_module_stack", {})
            if node.target != self.target or any(path == self.skip_module for path, _ in stack.values()):
                continue
            annotate_input_qspec_map(node, node.args[0], ACT)
            mark_annotated(node)
        return model

    def quantization_capabilities(self):
        return (Capability("linear", "static", TensorQuant("uint8", 0, 255)),)


def test_a_declared_op_left_float_without_a_reason_is_said_so():
    quantizer = Declares("silent", aten.linear.default, skip_module="fc2")
    prepared = qw.prepare_pt2e(export(Model(), torch.randn(1, 3, 8, 8)), quantizer)
    row = {r.node: r for r in annotation_report(prepared, quantizer).nodes}["linear_1"]
    assert (row.status, row.kind) == ("float", "unexplained")
    assert row.reason == "declared by silent (linear) but left float; silent gave no reason"


class FusedOnly(Weighted):
    """Declares relu only inside conv2d_relu (the fused activation) and annotates nothing."""

    def annotate(self, model):
        return model

    def quantization_capabilities(self):
        return (Capability("conv2d_relu", "static", TensorQuant("uint8", 0, 255)),)


class LoneRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x)), torch.relu(x * 2)


def test_an_op_declared_only_inside_a_chain_that_does_not_occur_is_not_applicable():
    """relu declared only as conv2d_relu's activation, after a mul: no occurrence of the chain,
    so the report says so (naming the chain and the producer) instead of 'unexplained'; inside
    an occurrence the quantizer still owes a reason."""
    quantizer = FusedOnly("fused", aten.conv2d.default)
    prepared = qw.prepare_pt2e(export(LoneRelu(), torch.randn(1, 3, 8, 8)), quantizer)
    rows = {r.node: r for r in annotation_report(prepared, quantizer).nodes}
    assert (rows["relu_1"].status, rows["relu_1"].kind) == ("float", "not_applicable")
    assert "conv2d_relu (fused)" in rows["relu_1"].reason and "mul" in rows["relu_1"].reason
    assert rows["relu"].kind == "unexplained"  # after the conv: the chain occurs


# -- reasons against the capability table (x86, and compositions with it) -----------------------

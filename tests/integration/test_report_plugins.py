"""The annotation report of real quantizers and their compositions (x86, template): moved from
tests/core/test_report.py so that tests/core runs without plugins."""

import torch

import quantweave as qw
from quantweave.compose import ComposableQuantizer
from quantweave.plugin_api import Capability, TensorQuant
from quantweave.report import annotation_report
from tests.helpers import ConvMeanMlp, Weighted, export

aten = torch.ops.aten


def test_a_relu_fused_by_a_composed_member_is_reported_quantized_by_it():
    pytest = __import__("pytest")
    x86 = pytest.importorskip("quantweave_x86")

    class ConvRelu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return torch.relu(self.conv(x))

    composed = ComposableQuantizer([Weighted("linq", aten.linear.default), x86.X86InductorQuantizer()])
    prepared = qw.prepare_pt2e(export(ConvRelu(), torch.randn(1, 3, 8, 8)), composed)
    rows = {r.node: r for r in annotation_report(prepared, composed).nodes}
    assert (rows["conv2d"].status, rows["conv2d"].quantizer) == ("quantized", "x86")
    assert (rows["relu"].status, rows["relu"].quantizer) == ("quantized", "x86")
    assert rows["relu"].reason.startswith("fused")


class SigmoidPool(torch.nn.Module):
    """adaptive_avg_pool2d after a float sigmoid: x86 declares the pooling, but quantizes it
    only when its input is quantized (the report said 'no quantizer claims this pattern')."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.nn.functional.adaptive_avg_pool2d(torch.sigmoid(self.conv(x)), 1)
        return self.fc(torch.flatten(y, 1))


def _models():
    from quantweave.testing.models import encoder_block, example_inputs, mobilenet_v2_like, resnet18_like

    for build in (resnet18_like, mobilenet_v2_like, encoder_block):
        model = build()
        yield build.__name__, model, example_inputs(model)
    yield "sigmoid_pool", SigmoidPool().eval(), (torch.randn(1, 3, 8, 8),)


def _quantizers():
    pytest = __import__("pytest")
    x86 = pytest.importorskip("quantweave_x86")
    template = pytest.importorskip("quantweave_contrib_template.quantizer")
    yield "x86", x86.X86InductorQuantizer()
    yield "template+x86", ComposableQuantizer([template.TemplateQuantizer(), x86.X86InductorQuantizer()])
    yield "x86+template", ComposableQuantizer([x86.X86InductorQuantizer(), template.TemplateQuantizer()])
    yield "linq+x86", ComposableQuantizer([Weighted("linq", aten.linear.default), x86.X86InductorQuantizer()])


def _declared_ops(quantizer):
    members = quantizer.quantizers if isinstance(quantizer, ComposableQuantizer) else [quantizer]
    ops = {}
    for member in members:
        for cap in member.quantization_capabilities():
            for op in cap.ops:
                ops.setdefault(op, set()).add(getattr(member, "name", type(member).__name__))
    return ops


def test_a_node_whose_op_a_member_declares_never_says_no_quantizer_claims_it():
    import re

    checked = {"not_applicable": 0, "shadowed": 0}
    # each model exported once for the four quantizers (prepare_pt2e never modifies its input)
    exported = [(mname, torch.export.export(model, args).module()) for mname, model, args in _models()]
    for qname, quantizer in _quantizers():
        table = quantizer.capability_table() if isinstance(quantizer, ComposableQuantizer) else []
        shadowed_in_table = {(row.pattern, member) for row in table for member in row.shadowed}
        declared = _declared_ops(quantizer)
        for mname, graph in exported:
            prepared = qw.prepare_pt2e(graph, quantizer)
            for row in annotation_report(prepared, quantizer).nodes:
                where = f"{qname} on {mname}: {row.node} ({row.op}): {row.reason}"
                if row.status == "quantized":
                    continue
                assert "no quantizer claims" not in row.reason, where
                if row.op not in declared:
                    assert row.kind in ("undeclared", "skipped"), where
                    continue
                # x86 declares it: the report gives x86's rule, or names the earlier member shadowing it
                assert row.kind in ("not_applicable", "shadowed", "skipped"), where
                checked[row.kind] = checked.get(row.kind, 0) + 1
                if row.kind == "shadowed":
                    found = re.match(r"shadowed: (\w+) \(declared by (\S+)\)", row.reason) or re.match(
                        r"shadowed: (\S+) quantizes (\w+) only after", row.reason
                    )
                    assert found, where
                    pattern, member = found.groups() if "(declared by" in row.reason else found.groups()[::-1]
                    if qname != "linq+x86":  # linq declares nothing: the table cannot foresee its claims
                        assert (pattern, member) in shadowed_in_table, where  # the table agrees it is shadowed
                    assert "earlier member" in row.reason, where
    assert checked["not_applicable"] and checked["shadowed"]  # both kinds were met, so both were checked


def test_pooling_after_a_float_sigmoid_gives_the_x86_rule():
    pytest = __import__("pytest")
    x86 = pytest.importorskip("quantweave_x86")
    quantizer = x86.X86InductorQuantizer()
    prepared = qw.prepare_pt2e(export(SigmoidPool(), torch.randn(1, 3, 8, 8)), quantizer)
    rows = {r.node: r for r in annotation_report(prepared, quantizer).nodes}
    pool = rows["adaptive_avg_pool2d"]
    assert (pool.status, pool.kind) == ("float", "not_applicable")
    assert pool.reason.startswith(
        "declared by x86 (adaptive_avg_pool2d) but not applicable here: input is not quantized"
    )
    assert "sigmoid is float" in pool.reason
    assert rows["sigmoid"].reason == "x86 declares no pattern with this op"
    assert rows["flatten"].kind == "not_applicable"


def test_a_pattern_an_earlier_member_shadows_names_it_and_what_it_serves_it_as():
    pytest = __import__("pytest")
    x86 = pytest.importorskip("quantweave_x86")

    class ConvAdd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)

        def forward(self, x):
            return self.conv(x) + x

    conv_first = Weighted("convq", aten.conv2d.default)
    composed = ComposableQuantizer([conv_first, x86.X86InductorQuantizer()])
    conv_first.quantization_capabilities = lambda: (  # declares conv2d: it claims conv2d_add's conv
        Capability("conv2d", "static", TensorQuant("uint8", 0, 255)),
    )
    prepared = qw.prepare_pt2e(export(ConvAdd(), torch.randn(1, 3, 8, 8)), composed)
    add = {r.node: r for r in annotation_report(prepared, composed).nodes}["add"]
    assert (add.status, add.kind) == ("float", "shadowed")
    assert add.reason == (
        "shadowed: conv2d_add (declared by x86) is served here by earlier member convq as its conv2d, "
        "which claimed conv2d"
    )
    (row,) = [r for r in composed.capability_table() if r.pattern == "conv2d_add"]
    assert row.shadowed == ("x86",) and row.served_as[0] == ("convq", "conv2d")


def test_a_node_x86_skips_by_configuration_names_it():
    pytest = __import__("pytest")
    x86 = pytest.importorskip("quantweave_x86")
    quantizer = x86.X86InductorQuantizer().set_module_name_qconfig("fc2", None)
    prepared = qw.prepare_pt2e(export(ConvMeanMlp(), torch.randn(1, 3, 8, 8)), quantizer)
    row = {r.node: r for r in annotation_report(prepared, quantizer).nodes}["linear_1"]
    assert (row.status, row.kind, row.reason) == (
        "float",
        "skipped",
        "skipped by x86: module name 'fc2' configured None",
    )

"""The pattern vocabulary matches a node as the op it computes (issue #13, fuzz gaps of
issue #16): an in-place op as its functional op, a conv with a string padding as the conv.
Matching (``quantweave._modules.patterns``), the conformance kit's rules and the capability
table all go through ``quantweave.capabilities.vocabulary_op``."""

import pytest
import torch
import torch.nn.functional as F

import quantweave as qw
from quantweave._modules.patterns import chain_of, matches, node_op
from quantweave.authoring import annotate_output_qspec
from quantweave.capabilities import PROBE_PRODUCERS, vocabulary_op
from quantweave.observers import MinMaxObserver
from quantweave.plugin_api import mark_annotated
from quantweave.testing.conformance import PROBES, _undeclared
from quantweave.vocabulary import PATTERNS
from tests.helpers import export

aten = torch.ops.aten


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("aten.relu_.default", "aten.relu.default"),
        ("aten.hardtanh_.default", "aten.hardtanh.default"),
        ("aten.add_.Tensor", "aten.add.Tensor"),
        ("aten.mul_.Tensor", "aten.mul.Tensor"),
        ("aten.silu_.default", "aten.silu.default"),
        ("aten.conv1d.padding", "aten.conv1d.default"),
        ("aten.conv2d.padding", "aten.conv2d.default"),
        ("aten.conv3d.padding", "aten.conv3d.default"),
        # unchanged: functional ops, private aten ops, dunder ops, other namespaces
        ("aten.relu.default", "aten.relu.default"),
        ("aten._to_copy.default", "aten._to_copy.default"),
        ("aten.__and__.Tensor", "aten.__and__.Tensor"),
        ("quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.quantize_per_tensor.default"),
        ("mylib.scale_.default", "mylib.scale_.default"),
    ],
)
def test_vocabulary_op(op, expected):
    assert vocabulary_op(op) == expected


class InPlace(torch.nn.Module):
    """Every in-place form the fuzz generates, after a conv / a linear."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.relu = torch.nn.ReLU(inplace=True)
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        a = self.relu(self.conv(x))  # relu_
        b = F.hardtanh(self.conv(x), inplace=True)  # hardtanh_
        h = self.fc(y)
        h += y  # add_
        h.mul_(y)  # mul_
        return a, b, h


def _graph():
    return export(InPlace(), torch.randn(1, 3, 6, 6), torch.randn(2, 4))


@pytest.mark.parametrize(
    ("pattern", "ops"),
    [
        ("conv2d_relu", ("conv2d", "relu_")),
        ("conv2d_hardtanh", ("conv2d", "hardtanh_")),
        ("conv2d_relu6", ("conv2d", "hardtanh_")),  # relu6 may export as hardtanh
        ("linear_add", ("linear", "add_")),
        ("mul", ("mul_",)),
    ],
)
def test_an_inplace_op_matches_as_its_functional_op(pattern, ops):
    gm = _graph()
    found = matches(gm.graph, chain_of(PATTERNS[pattern][1]))
    assert [tuple(str(n.target).split(".")[1] for n in occ) for occ in found] == [ops]


class Padded(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding="same")
        self.conv1 = torch.nn.Conv1d(3, 4, 3, padding="valid")

    def forward(self, x, s):
        return torch.relu(self.conv(x)), self.conv1(s)


def test_a_conv_with_a_string_padding_matches_as_the_conv():
    gm = export(Padded(), torch.randn(1, 3, 6, 6), torch.randn(1, 3, 8))
    targets = sorted(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    assert targets == ["aten.conv1d.padding", "aten.conv2d.padding", "aten.relu.default"]
    conv2d_relu = matches(gm.graph, chain_of(PATTERNS["conv2d_relu"][1]))
    assert [(node_op(a), node_op(b)) for a, b in conv2d_relu] == [("aten.conv2d.default", "aten.relu.default")]
    assert len(matches(gm.graph, chain_of(PATTERNS["conv1d"][1]))) == 1


def _act():
    return qw.QuantizationSpec(
        dtype=torch.uint8, observer_or_fake_quant_ctr=MinMaxObserver, qscheme=torch.per_tensor_affine
    )


def test_the_conformance_rule_sees_inplace_ops():
    """'Nothing annotated outside a declared pattern': an annotation on relu_ inside a
    declared conv2d_relu is covered; one on mul_ with no declared mul is flagged, named."""
    gm = _graph()
    relu = next(n for n in gm.graph.nodes if n.target == aten.relu_.default)
    mul = next(n for n in gm.graph.nodes if n.target == aten.mul_.Tensor)
    for node in (relu, mul):
        annotate_output_qspec(node, _act())
        mark_annotated(node)
    declared = [chain_of(PATTERNS[p][1]) for p in ("conv2d_relu",)]
    problems = _undeclared(gm, declared, qw.capabilities.Mode.STATIC)
    assert len(problems) == 1 and "'mul_' (aten.mul_.Tensor)" in problems[0], problems
    assert not _undeclared(gm, [*declared, chain_of(PATTERNS["mul"][1])], qw.capabilities.Mode.STATIC)


def test_standalone_activations_are_probed_behind_a_cat():
    """relu / hardtanh / relu6 on their own are probed after a cat of two convs, which no
    backend fuses them into: a quantizer that quantizes them only after a quantized producer
    (input_from "any", xnnpack) can be conformance-tested, and the capability table sees the
    cat before them."""
    for pattern in ("relu", "hardtanh", "relu6"):
        assert PROBE_PRODUCERS[pattern] == "cat"
        model, inputs = PROBES[pattern]()
        gm = torch.export.export(model, inputs).module()
        (occurrence,) = matches(gm.graph, chain_of(PATTERNS[pattern][1]))
        assert str(occurrence[0].args[0].target) == "aten.cat.default"

"""x86 and convs with a string padding (``padding="same"`` / ``"valid"``, exported as
``aten.conv{1,2}d.padding``), and in-place ops x86 does not match (fuzz gaps, issue #16).

Before: x86 matched ``aten.conv2d.default`` only, so a model of ``padding="same"`` convs
was silently left float (as torchao 0.18's X86InductorQuantizer does). Now
``transform_for_annotation`` writes such a conv as the conv with explicit padding it equals,
where the padding is the same on both sides; inductor lowers it to the same int8 conv.
``"same"`` that pads one side more (an even kernel) stays float, with a reason."""

import pytest
import torch

import quantweave as qw
from quantweave.plugin_api import SKIP_REASON_KEY, is_annotated
from tests.helpers import export

aten = torch.ops.aten


class Convs(torch.nn.Module):
    def __init__(self, padding, kernel=3, dilation=1, dims=2):
        super().__init__()
        conv = torch.nn.Conv2d if dims == 2 else torch.nn.Conv1d
        self.a = conv(3, 8, kernel, padding=padding)
        self.b = conv(8, 8, kernel, padding=padding, dilation=dilation)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _prepare(model, x):
    import quantweave_x86

    gm = export(model, x)
    code = gm.code
    # activations in [0, 127] where the CPU's int8 kernels would saturate (no VNNI / AMX)
    quantizer = qw.get_quantizer("x86", reduce_range=quantweave_x86.cpu_needs_reduce_range())
    prepared = qw.prepare_pt2e(gm, quantizer)
    assert gm.code == code  # the caller's exported graph keeps its padding convs
    return gm, quantizer, prepared


@pytest.mark.parametrize(
    ("padding", "kernel", "dilation", "dims", "expected"),
    [
        ("same", 3, 1, 2, [1, 1]),
        ("same", 3, 2, 2, [2, 2]),  # the second conv: dilation 2
        ("same", 5, 1, 2, [2, 2]),
        ("valid", 3, 1, 2, [0, 0]),
        ("same", 3, 1, 1, [1]),
    ],
)
def test_a_conv_with_even_padding_is_quantized_as_the_conv_it_equals(padding, kernel, dilation, dims, expected):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 12, 12) if dims == 2 else torch.randn(2, 3, 16)
    gm, quantizer, prepared = _prepare(Convs(padding, kernel, dilation, dims), x)
    default = aten.conv2d.default if dims == 2 else aten.conv1d.default
    convs = [n for n in prepared.graph.nodes if n.target == default]
    assert len(convs) == 2 and all(is_annotated(n) for n in convs)
    assert list(convs[1].args[4]) == expected
    assert not any(str(n.target).endswith(".padding") for n in prepared.graph.nodes)
    report = qw.annotation_report(prepared, quantizer)
    assert report.float == 0 and report.quantized == 3  # two convs, the fused relu
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    reference = gm(x)
    error = (converted(x) - reference).pow(2).mean() / reference.pow(2).mean()
    assert float(error) < 1e-2


def test_a_same_conv_that_pads_one_side_more_stays_float_with_a_reason():
    x = torch.randn(1, 3, 12, 12)
    _, quantizer, prepared = _prepare(Convs("same", kernel=4), x)
    convs = [n for n in prepared.graph.nodes if n.target == aten.conv2d.padding]
    assert len(convs) == 2 and not any(is_annotated(n) for n in convs)
    for conv in convs:
        assert "pads one side more than the other" in conv.meta[SKIP_REASON_KEY]
    relu = next(r for r in qw.annotation_report(prepared, quantizer).nodes if r.op == "aten.relu.default")
    assert relu.status == "float" and "here it follows conv2d, which stays float" in relu.reason


def test_annotating_without_the_transform_says_why_a_padding_conv_stays_float():
    gm = export(Convs("same"), torch.randn(1, 3, 12, 12))
    quantizer = qw.get_quantizer("x86")
    annotated = quantizer.annotate(gm)  # no transform_for_annotation: the padding convs stay
    conv = next(n for n in annotated.graph.nodes if n.target == aten.conv2d.padding)
    assert not is_annotated(conv)
    assert "transform_for_annotation" in conv.meta[SKIP_REASON_KEY]


def test_the_transform_returns_the_model_itself_when_nothing_changes():
    gm = export(Convs(1), torch.randn(1, 3, 12, 12))
    assert qw.get_quantizer("x86").transform_for_annotation(gm) is gm


def test_a_padding_same_conv_lowers_to_the_int8_conv():
    """Inductor's int8 conv passes take the rewritten conv as any other: both convs become
    oneDNN int8 convs (the weight-prepack pass matches them), and the lowered model agrees
    with the converted one."""
    from torch._dynamo.utils import counters

    import quantweave_x86

    torch.manual_seed(0)
    x = torch.randn(2, 3, 12, 12)
    _, _, prepared = _prepare(Convs("same"), x)
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    counters.clear()
    lowered = quantweave_x86.lower(converted, (x,))
    out = lowered(x)
    assert counters["inductor"]["qconv_weight_prepack_matcher_count"] == 2
    assert torch.allclose(out, converted(x), atol=1e-3)


class InPlaceBinary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        h += x
        return h.mul_(x)


class InPlaceSeenThroughAView(InPlaceBinary):
    def forward(self, x):
        h = self.fc(x)
        v = h.view(-1)  # taken before the write, it sees it: the add stays in place
        h += x
        return v, h.mul_(x)


def test_an_inplace_add_and_mul_are_quantized_as_their_functional_ops():
    """prepare rewrites an in-place op whose write nobody sees into its functional op (same
    node name) on its copy, so x86's linear_add and mul patterns match it; the caller's graph
    keeps its in-place ops."""
    quantizer = qw.get_quantizer("x86")
    model = export(InPlaceBinary(), torch.randn(2, 4))
    prepared = qw.prepare_pt2e(model, quantizer)
    nodes = {n.name: n for n in prepared.graph.nodes}
    assert nodes["add_"].target == aten.add.Tensor and is_annotated(nodes["add_"])
    assert nodes["mul_"].target == aten.mul.Tensor and is_annotated(nodes["mul_"])
    targets = {n.target for n in model.graph.nodes}
    assert {aten.add_.Tensor, aten.mul_.Tensor} <= targets and aten.add.Tensor not in targets


def test_an_inplace_add_or_mul_whose_write_is_seen_stays_float_with_a_reason():
    """An in-place op whose write another tensor sees (a view taken before it) is not
    rewritten; x86 matches add / mul in their functional form only, and says so."""
    quantizer = qw.get_quantizer("x86")
    prepared = qw.prepare_pt2e(export(InPlaceSeenThroughAView(), torch.randn(2, 4)), quantizer)
    for target in (aten.add_.Tensor, aten.mul_.Tensor):
        node = next(n for n in prepared.graph.nodes if n.target == target)
        assert not is_annotated(node)
        assert "is in place: x86 quantizes" in node.meta[SKIP_REASON_KEY], node.meta[SKIP_REASON_KEY]

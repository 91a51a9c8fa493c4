"""Regression tests for bugs the fuzz tests (tests/fuzz, issue #16) found, as plain examples.

Each test is the shrunk example hypothesis reported, written out by hand; the docstring
says what failed before the fix.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.ao.quantization.observer import HistogramObserver as TorchHistogramObserver

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map
from quantweave.observers import HistogramObserver, MinMaxObserver
from quantweave.plugin_api import is_annotated, mark_annotated
from quantweave.vocabulary import PATTERNS
from tests.helpers import export

aten = torch.ops.aten
KEY = "quantization_annotation"


def act(dtype=torch.uint8):
    return qw.QuantizationSpec(dtype=dtype, observer_or_fake_quant_ctr=MinMaxObserver, qscheme=torch.per_tensor_affine)


class FnQuantizer(qw.Quantizer):
    name = "fn"

    def __init__(self, fn):
        self.fn = fn

    def annotate(self, model):
        self.fn(model)
        return model


class Float64Island(torch.nn.Module):
    """Shrunk from the fuzz: ``linear -> .to(float64) -> y * y -> .float()``."""

    def __init__(self, dtype=torch.float64):
        super().__init__()
        self.dtype = dtype
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x).to(self.dtype)
        return (y * y).float()


def _flow(model, quantizer, x):
    prepared = qw.prepare_pt2e(export(model, x), quantizer)
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    return prepared, converted, converted(x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_x86_leaves_a_mul_of_non_float32_tensors_float(dtype):
    """Before: x86 annotated the mul of float64 tensors; convert inserted
    quantize_per_tensor on a float64 tensor and the converted model raised AssertionError
    ("Expecting input to have dtype torch.float32") when run. With QAT, the fused
    fake-quantizer raised RuntimeError on a float16 / bfloat16 mul during training
    ("expected scalar type Float but found Half"). Now such a mul stays float, with a
    reason naming the dtype."""
    x = torch.randn(2, 4)
    quantizer = qw.get_quantizer("x86")
    prepared, _, out = _flow(Float64Island(dtype), quantizer, x)
    assert torch.isfinite(out).all()
    mul = next(n for n in prepared.graph.nodes if n.target == aten.mul.Tensor)
    assert not is_annotated(mul)
    row = next(r for r in qw.annotation_report(prepared, quantizer).nodes if r.node == mul.name)
    assert row.status == "float"
    assert str(dtype) in row.reason


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_x86_qat_trains_a_model_with_a_half_precision_mul(dtype):
    """The shrunk QAT example: ``cat([x, (x.half() * x.half()).float()])``."""

    class Model(torch.nn.Module):
        def forward(self, x):
            y = x.to(dtype)
            return torch.cat([x, (y * y).float()], 1)

    x = torch.randn(2, 1)
    gm = torch.export.export(Model().train(), (x,)).module()
    prepared = qw.prepare_qat_pt2e(gm, qw.get_quantizer("x86", is_qat=True))
    prepared(x)
    qw.move_exported_model_to_eval(prepared)
    assert torch.isfinite(qw.convert_pt2e(prepared)(x)).all()


def test_prepare_rejects_a_spec_on_a_float64_tensor_naming_edge_and_quantizer():
    """Before: a spec on a float64 tensor prepared, calibrated and converted, and the
    converted model raised AssertionError from quantize_per_tensor at run time. Now
    prepare_pt2e raises AnnotationError naming the edge, the tensor and the quantizer."""

    def annotate(gm):
        mul = next(n for n in gm.graph.nodes if n.target == aten.mul.Tensor)
        annotate_input_qspec_map(mul, mul.args[0], act())
        mark_annotated(mul)

    gm = export(Float64Island(), torch.randn(2, 4))
    with pytest.raises(qw.AnnotationError, match=r"edge 'to' -> 'mul'.*'fn'.*'to'.*torch\.float64"):
        qw.prepare_pt2e(gm, FnQuantizer(annotate))


# -- known gaps the fuzz excuses (tests/fuzz/properties.py), pinned as strict xfails --------
# When one of these starts passing, remove its xfail *and* its excuse in tests/fuzz/properties.py.


def _report_row(prepared, quantizer, name):
    return next((r for r in qw.annotation_report(prepared, quantizer).nodes if r.node == name), None)


class SigmoidRelu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(torch.sigmoid(x))


class SharedConvRelu(torch.nn.Module):
    """A conv whose output feeds a relu and the model output: not fusable."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y), y


@pytest.mark.parametrize(
    ("model", "x", "said"),
    [
        (SigmoidRelu(), torch.randn(2, 4), "here it follows sigmoid"),
        (SharedConvRelu(), torch.randn(1, 3, 8, 8), "its input conv2d has other users"),
    ],
)
def test_template_says_why_a_relu_stays_float(model, x, said):
    """Before (fuzz gap template-relu-without-reason, issue #13): the template declares
    conv2d_relu / linear_relu and left any other relu float without set_skip_reason, so the
    report said 'unexplained'. Now the reason names the rule and what the relu follows."""
    quantizer = qw.get_quantizer("template")
    prepared = qw.prepare_pt2e(export(model, x), quantizer)
    row = _report_row(prepared, quantizer, "relu")
    assert row is not None and row.status == "float"
    assert row.kind == "not_applicable", row
    assert "only fused after its conv2d / linear" in row.reason and said in row.reason, row.reason


class ConvInPlaceRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.relu = torch.nn.ReLU(inplace=True)  # torchvision's ResNet writes it so

    def forward(self, x):
        return self.relu(self.conv(x))


def test_inplace_ops_are_matched_as_their_functional_op():
    """Before (fuzz gap inplace-op-not-in-vocabulary, issue #13): x86 fused a conv with
    ``nn.ReLU(inplace=True)`` but no declared pattern matched ``relu_``. Now the vocabulary
    matches an in-place op as its functional op: the conformance kit's rule finds the x86
    annotation inside a declared conv2d_relu."""
    from quantweave._modules.patterns import chain_of, matches

    quantizer = qw.get_quantizer("x86")
    prepared = qw.prepare_pt2e(export(ConvInPlaceRelu(), torch.randn(1, 3, 8, 8)), quantizer)
    # prepare annotates relu_ (whose write nobody else sees) as relu, under its own name
    relu = next(n for n in prepared.graph.nodes if n.name == "relu_")
    conv = next(n for n in prepared.graph.nodes if n.target == aten.conv2d.default)
    assert relu.target in (aten.relu_.default, aten.relu.default)
    assert is_annotated(relu)
    assert matches(prepared.graph, chain_of(PATTERNS["conv2d_relu"][1])) == [(conv, relu)]


def test_report_lists_inplace_ops():
    """Before (fuzz gap inplace-op-not-in-report, issue #13): the report compared
    str(node.target) with the vocabulary and did not list relu_ although x86 fused it."""
    quantizer = qw.get_quantizer("x86")
    prepared = qw.prepare_pt2e(export(ConvInPlaceRelu(), torch.randn(1, 3, 8, 8)), quantizer)
    relu = next(n for n in prepared.graph.nodes if n.name == "relu_")  # annotated as relu (prepare)
    assert is_annotated(relu)  # x86 fuses it with the conv
    assert _report_row(prepared, quantizer, relu.name) is not None


class SameConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding="same")  # exports as aten.conv2d.padding

    def forward(self, x):
        return self.conv(x)


def test_a_padding_same_conv_is_matched_as_a_conv():
    """Before (fuzz gap conv-padding-overload-not-in-vocabulary, issue #13): xnnpack
    quantized ``aten.conv2d.padding`` with no declaration covering it. Now the vocabulary
    matches it as the conv2d it is."""
    from quantweave._modules.patterns import chain_of, matches

    quantizer = qw.get_quantizer("xnnpack")
    prepared = qw.prepare_pt2e(export(SameConv(), torch.randn(1, 3, 8, 8)), quantizer)
    conv = next(n for n in prepared.graph.nodes if n.target == aten.conv2d.padding)
    assert is_annotated(conv)
    covered = {
        n
        for cap in quantizer.quantization_capabilities()
        for occ in matches(prepared.graph, chain_of(cap.ops))
        for n in occ
    }
    assert conv in covered


def test_report_lists_a_padding_same_conv():
    """Before (fuzz gap conv-padding-overload-not-in-report, issue #13): the report did not
    list aten.conv2d.padding, which xnnpack quantizes."""
    quantizer = qw.get_quantizer("xnnpack")
    prepared = qw.prepare_pt2e(export(SameConv(), torch.randn(1, 3, 8, 8)), quantizer)
    conv = next(n for n in prepared.graph.nodes if n.target == aten.conv2d.padding)
    assert is_annotated(conv)
    assert _report_row(prepared, quantizer, conv.name) is not None


def test_x86_quantizes_a_padding_same_conv():
    """Before: x86 matched aten.conv2d.default only, so a model of padding='same' convs was
    silently left float (as torchao 0.18's X86InductorQuantizer does). Now
    transform_for_annotation writes such a conv as the conv2d with explicit padding it
    equals (the caller's graph untouched), and x86 quantizes it; tests/x86 lowers one."""
    x = torch.randn(1, 3, 8, 8)
    gm = export(SameConv(), x)
    code = gm.code
    quantizer = qw.get_quantizer("x86")
    prepared = qw.prepare_pt2e(gm, quantizer)
    assert gm.code == code and any(n.target == aten.conv2d.padding for n in gm.graph.nodes)
    (conv,) = [n for n in prepared.graph.nodes if n.target == aten.conv2d.default]
    assert is_annotated(conv) and list(conv.args[4]) == [1, 1]
    prepared(x)
    assert torch.allclose(qw.convert_pt2e(prepared)(x), gm(x), atol=0.1)


def test_xnnpack_declares_the_relu_it_quantizes_after_a_cat():
    """Before (fuzz gap xnnpack-shared-op-after-an-undeclared-producer): xnnpack shared a
    cat's qparams on the relu after it, but declared relu only after its conv / linear / add
    / mul. Now it declares relu, hardtanh and relu6 quantized after any quantized producer
    (input_from "any")."""
    from quantweave._modules.patterns import chain_of, matches

    class CatRelu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(3, 2, 1), torch.nn.Conv2d(3, 2, 1)

        def forward(self, x):
            return torch.relu(torch.cat([self.a(x), self.b(x)], 1))

    quantizer = qw.get_quantizer("xnnpack")
    gm = quantizer.transform_for_annotation(export(CatRelu(), torch.randn(1, 3, 4, 4)))
    annotated = quantizer.annotate(gm)
    relu = next(n for n in annotated.graph.nodes if n.target == aten.relu.default)
    assert is_annotated(relu) and relu.meta[KEY].output_qspec is not None
    caps = quantizer.quantization_capabilities()
    covered = {n for cap in caps for occ in matches(annotated.graph, chain_of(cap.ops)) for n in occ}
    assert relu in covered


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="quantweave-xnnpack (as ExecuTorch's XNNPACKQuantizer) quantizes hardtanh / relu with its input's "
    "qparams: after a wide input (here +-3000) the step (~24) wipes out the [-1, 1] output; the report says "
    "'quantized' (fuzz gap xnnpack-clamp-shares-a-wide-input-range)",
)
def test_xnnpack_hardtanh_after_a_wide_input_keeps_its_output():
    from quantweave.testing.inspect import sqnr

    class LinearHardtanh(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.nn.functional.hardtanh(self.linear(x))

    torch.manual_seed(0)
    x = torch.randn(16, 8) * 1000
    gm = export(LinearHardtanh(), x)
    prepared = qw.prepare_pt2e(gm, qw.get_quantizer("xnnpack"))
    prepared(x)
    assert sqnr(gm(x), qw.convert_pt2e(prepared)(x)) > 15


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="torch's FusedMovingAvgObsFakeQuantize (the x86 and xnnpack QAT recipes) computes its scale "
    "without the observer's eps (2**-12) while convert_pt2e takes the observer's eps-clamped qparams, so on "
    "tensors with a range below 255 * 2**-12 the converted model differs from the one QAT trained; "
    "torchao 0.18 does the same (parity) (fuzz gap qat-fused-fake-quant-ignores-observer-eps)",
)
def test_qat_fake_quantizer_trains_with_the_scale_convert_uses():
    from quantweave.observers import FakeQuantizeBase

    class Small(torch.nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            return y + y + x

    torch.manual_seed(0)
    batches = [torch.randn(2, 4) * 1e-3 for _ in range(3)]
    gm = torch.export.export(Small().train(), (batches[0],)).module()
    prepared = qw.prepare_qat_pt2e(gm, qw.get_quantizer("xnnpack", is_qat=True))
    for x in batches[:2]:
        prepared(x)
    qw.move_exported_model_to_eval(prepared)
    converted = qw.convert_pt2e(prepared)
    for module in prepared.modules():
        if isinstance(module, FakeQuantizeBase):
            module.disable_observer()
    assert torch.allclose(prepared(batches[2]), converted(batches[2]))


class QatLinear(torch.nn.Module):
    """Shrunk from the fuzz (QAT, x86): the linear whose weight channel is all of one sign
    (the attention's ``k`` projection of ``self_matmul -> relu -> branch(relu, relu |
    attention, relu) -> ...``, inputs scaled by 1e3)."""

    def __init__(self, weight):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        with torch.no_grad():
            self.linear.weight.copy_(weight)

    def forward(self, x):
        return self.linear(x)


#: its k weight, rounded: channel 0 all negative, channels 1 and 2 spanning 0
ONE_SIGNED_CHANNEL = [[-0.31, -0.38, -0.43], [0.12, 0.56, -0.28], [-0.33, 0.53, 0.39]]


def _qat_x86(weight):
    """x86 QAT on :class:`QatLinear`: two training steps, eval, convert; returns the
    fake-quantized model (observers off), the converted one, a test batch and the weight's
    fake-quantizer."""
    from quantweave.observers import FakeQuantizeBase

    torch.manual_seed(0)
    batches = [torch.randn(4, 3) for _ in range(3)]
    gm = torch.export.export(QatLinear(torch.tensor(weight)).train(), (batches[0],)).module()
    prepared = qw.prepare_qat_pt2e(gm, qw.get_quantizer("x86", is_qat=True))
    for x in batches[:2]:
        prepared(x)
    qw.move_exported_model_to_eval(prepared)
    converted = qw.convert_pt2e(prepared)
    fake_quantizers = [m for m in prepared.modules() if isinstance(m, FakeQuantizeBase)]
    for module in fake_quantizers:
        module.disable_observer()
    weight_fq = next(m for m in fake_quantizers if m.qscheme == torch.per_channel_symmetric)
    return prepared, converted, batches[2], weight_fq


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="torch's FusedMovingAvgObsFakeQuantize (the x86 and xnnpack QAT recipes) chooses its qparams in its "
    "kernel (ATen's ChooseQuantizationParams), not with its observer's calculate_qparams, which convert_pt2e uses: "
    "a symmetric int8 weight channel gets scale max(-min/128, max/127) instead of max(-min, max)/127.5, and a "
    "channel of one sign an affine scale and zero point (here 0.0017, 127 instead of 0.0034, 0), so the converted "
    "model differs from the one QAT trained; torchao 0.18 does the same (parity) "
    "(fuzz gap qat-fused-fake-quant-chooses-other-symmetric-qparams)",
)
def test_qat_fake_quantizer_trains_with_the_symmetric_qparams_convert_uses():
    prepared, converted, x, weight_fq = _qat_x86(ONE_SIGNED_CHANNEL)
    with torch.no_grad():
        simulated, out = prepared(x), converted(x)
    scale, zero_point = weight_fq.calculate_qparams()
    assert torch.equal(weight_fq.zero_point, zero_point.to(weight_fq.zero_point.dtype)), (
        f"fake-quantizer zero points {weight_fq.zero_point.tolist()}, convert's {zero_point.tolist()}"
    )
    assert torch.equal(weight_fq.scale, scale), (
        f"fake-quantizer scales {weight_fq.scale.tolist()}, convert's {scale.tolist()}"
    )
    assert torch.allclose(simulated, out)


class Double(torch.nn.Module):
    """Shrunk from the fuzz: ``x @ x.T`` on inputs scaled by 1e3, pooled, multiplied back
    and doubled (values up to ~4.6e13), xnnpack alone or as ExecuTorch's vision recipe."""

    def forward(self, x):
        return x + x


def test_histogram_observer_keeps_the_range_of_values_near_1e13():
    """torch's HistogramObserver (and torchao's, which ExecuTorch's XNNPACKQuantizer uses)
    computes its L2 search error in float32: clipping a bin ~7e12 away cubes to inf, the
    error is NaN, 'NaN > norm_min' never stops the search, and the range shrinks to a sliver
    (here the output of x + x, [0, 2e13], would get scale 3.8e7 and keep [0, 9.8e9]: 0 dB).
    quantweave's takes that error in float64 and keeps the range."""
    from quantweave.testing.inspect import sqnr

    x = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 2.0]]) * 5e12
    gm = export(Double(), x)
    prepared = qw.prepare_pt2e(gm, qw.get_quantizer("xnnpack"))
    prepared(x)
    assert sqnr(gm(x), qw.convert_pt2e(prepared)(x)) > 40  # measured 50.8 dB

    torch_observer = TorchHistogramObserver(dtype=torch.qint8, qscheme=torch.per_tensor_affine)
    torch_observer(x + x)
    scale, _ = torch_observer.calculate_qparams()
    assert float(scale) * 255 < 1e11  # torch's own observer: the sliver (the bug avoided above)


def test_histogram_observer_qparams_stay_torchs_below_the_overflow():
    """Where torch's float32 error is finite (values up to ~4e12 here), quantweave's
    HistogramObserver gives torch's qparams exactly."""
    for scale in (1.0, 1e6, 2e12):
        x = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 2.0]]) * scale
        ours = HistogramObserver(dtype=torch.qint8, qscheme=torch.per_tensor_affine)
        theirs = TorchHistogramObserver(dtype=torch.qint8, qscheme=torch.per_tensor_affine)
        ours(x + x)
        theirs(x + x)
        assert [t.tolist() for t in ours.calculate_qparams()] == [t.tolist() for t in theirs.calculate_qparams()]


def test_xnnpack_explains_an_inplace_relu6_after_a_float_relu():
    """Shrunk from the fuzz (flow budget 800): relu6_ (in place) after a relu xnnpack left
    float stayed float with no reason (report kind 'unexplained')."""

    class M(torch.nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            F.relu6(y, inplace=True)
            return x + y

    x = torch.randn(2, 8)
    quantizer = qw.get_quantizer("xnnpack")
    prepared = qw.prepare_pt2e(export(M(), x), quantizer)
    rows = {r.node: r for r in qw.annotation_report(prepared, quantizer).nodes}  # relu6_: relu6 since #24
    assert rows["relu6_"].kind != "unexplained", rows["relu6_"]
    assert "no quantized output" in rows["relu6_"].reason


class SelfAdd(torch.nn.Module):
    """Shrunk from the lowering fuzz: ``y = conv(x); y + y`` (and the same with a linear)."""

    def __init__(self, kind):
        super().__init__()
        self.layer = torch.nn.Conv2d(3, 4, 3) if kind == "conv" else torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.layer(x)
        return y + y


@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_x86_does_not_fuse_an_add_of_a_tensor_with_itself(kind):
    """Before: x86 claimed ``conv(x) + conv(x)`` as a fused conv2d_add whose other operand
    was the conv's own output (no such fusion exists). Now the conv is quantized alone and
    the add stays float, with a reason."""
    x = torch.randn(1, 3, 8, 8) if kind == "conv" else torch.randn(2, 4)
    quantizer = qw.get_quantizer("x86")
    prepared = qw.prepare_pt2e(export(SelfAdd(kind), x), quantizer)
    add = next(n for n in prepared.graph.nodes if n.target == aten.add.Tensor)
    assert not is_annotated(add)
    row = _report_row(prepared, quantizer, add.name)
    assert row.status == "float" and "(x + x)" in row.reason


def test_x86_lowers_a_conv_followed_by_x_plus_x():
    """Before: quantweave_x86.lower raised BackendCompilerFailed (an AssertionError in torch
    2.13 inductor's int8 conv / linear + add fusion, which expects the add's other operand
    to be another tensor). lower() now compiles x + x as x * 2 (the same value)."""
    import quantweave_x86

    x = torch.randn(1, 3, 8, 8)
    quantizer = qw.get_quantizer("x86", reduce_range=quantweave_x86.cpu_needs_reduce_range())
    prepared = qw.prepare_pt2e(export(SelfAdd("conv"), x), quantizer)
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    code = converted.code
    lowered = quantweave_x86.lower(converted, (x,))
    assert converted.code == code  # the caller's converted model is not rewritten
    assert torch.allclose(lowered(x), converted(x), atol=0.05)

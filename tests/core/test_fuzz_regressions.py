"""Regression tests for bugs the fuzz tests (tests/fuzz, issue #16) found, as plain examples.

Each test is the shrunk example hypothesis reported, written out by hand; the docstring
says what failed before the fix.
"""

import pytest
import torch

import quantweave as qw
from quantweave.observers import MinMaxObserver
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


def test_x86_leaves_a_float64_mul_float():
    """Before: x86 annotated the float64 mul; convert inserted quantize_per_tensor on a
    float64 tensor and the converted model raised AssertionError ("Expecting input to have
    dtype torch.float32") when run. Now the mul stays float, with a reason."""
    x = torch.randn(2, 4)
    quantizer = qw.get_quantizer("x86")
    prepared, _, out = _flow(Float64Island(), quantizer, x)
    assert torch.isfinite(out).all()
    mul = next(n for n in prepared.graph.nodes if n.target == aten.mul.Tensor)
    assert not qw.is_annotated(mul)
    row = next(r for r in qw.annotation_report(prepared, quantizer).nodes if r.node == mul.name)
    assert row.status == "float"
    assert "torch.float64" in row.reason


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_x86_still_quantizes_a_half_precision_mul(dtype):
    """The dtype rule keeps what quantize_per_tensor accepts (float16 / bfloat16 are widened)."""
    x = torch.randn(2, 4)
    prepared, _, out = _flow(Float64Island(dtype), qw.get_quantizer("x86"), x)
    assert torch.isfinite(out).all()
    mul = next(n for n in prepared.graph.nodes if n.target == aten.mul.Tensor)
    assert qw.is_annotated(mul)


def test_prepare_rejects_a_spec_on_a_float64_tensor_naming_edge_and_quantizer():
    """Before: a spec on a float64 tensor prepared, calibrated and converted, and the
    converted model raised AssertionError from quantize_per_tensor at run time. Now
    prepare_pt2e raises AnnotationError naming the edge, the tensor and the quantizer."""

    def annotate(gm):
        mul = next(n for n in gm.graph.nodes if n.target == aten.mul.Tensor)
        qw.annotate_input_qspec_map(mul, mul.args[0], act())
        qw.mark_annotated(mul)

    gm = export(Float64Island(), torch.randn(2, 4))
    with pytest.raises(qw.AnnotationError, match=r"edge 'to' -> 'mul'.*'fn'.*'to'.*torch\.float64"):
        qw.prepare_pt2e(gm, FnQuantizer(annotate))

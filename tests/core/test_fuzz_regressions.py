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
    assert not qw.is_annotated(mul)
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
        qw.annotate_input_qspec_map(mul, mul.args[0], act())
        qw.mark_annotated(mul)

    gm = export(Float64Island(), torch.randn(2, 4))
    with pytest.raises(qw.AnnotationError, match=r"edge 'to' -> 'mul'.*'fn'.*'to'.*torch\.float64"):
        qw.prepare_pt2e(gm, FnQuantizer(annotate))

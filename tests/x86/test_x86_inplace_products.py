"""x86 on what torchvision and transformers write: a residual ``out += identity`` with in-place
relus (quantized as conv2d_add_relu, lowered to inductor's int8 conv + add), and linears
written as matrix products (GPT-2's Conv1D as addmm of an [in, out] weight, ``x @ W + b``),
quantized with the weight per channel on axis 1 and lowered to inductor's int8 linear."""

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import quantweave as qw
from quantweave_x86 import X86InductorQuantizer, declared_capabilities, lower
from tests.helpers import export
from tests.library_style import BasicBlock, Mlp

aten = torch.ops.aten


def _flow(model, x):
    torch.manual_seed(0)
    quantizer = X86InductorQuantizer(reduce_range=True)  # exact int8 kernels on CPUs without VNNI too
    prepared = qw.prepare_pt2e(export(model, x), quantizer)
    qw.calibrate(prepared, [(torch.randn_like(x),) for _ in range(4)], progress=False)
    converted = qw.convert_pt2e(prepared)
    counters.clear()
    lowered = lower(converted, (x,))
    found = dict(counters["inductor"])
    return prepared, quantizer, converted, lowered, found


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    return (x, *_flow(BasicBlock().eval(), x))


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 16)
    return (x, *_flow(Mlp().eval(), x))


def test_the_in_place_residual_add_is_quantized_and_fused_into_the_int8_conv(block):
    x, prepared, quantizer, converted, lowered, found = block
    report = qw.annotation_report(prepared, quantizer)
    assert report.float == 0, report.to_table()
    rows = {r.node: r for r in report.nodes}
    assert rows["add_"].op == "aten.add.Tensor" and rows["add_"].status == "quantized"
    assert found.get("qconv2d_binary_matcher_count") == 1, found  # conv2 + add (+ relu): one int8 kernel
    torch.testing.assert_close(lowered(x), converted(x), rtol=1e-4, atol=1e-4)


def test_addmm_mm_and_matmul_with_a_constant_weight_are_quantized_as_linears(mlp):
    x, prepared, quantizer, converted, lowered, found = mlp
    rows = {r.node: r for r in qw.annotation_report(prepared, quantizer).nodes}
    assert rows["addmm"].status == rows["addmm_1"].status == rows["matmul"].status == "quantized"
    axes = [
        n.args[3]
        for n in converted.graph.nodes
        if n.target == torch.ops.quantized_decomposed.dequantize_per_channel.default
    ]
    assert axes == [1, 1, 1]  # [in, out] weights: the output channels
    assert found.get("qlinear_weight_prepack_matcher_count") == 3, found  # three int8 linears
    torch.testing.assert_close(lowered(x), converted(x), rtol=1e-4, atol=1e-4)


def test_a_product_of_two_activations_stays_opt_in():
    class Attention(nn.Module):
        def forward(self, q, k):
            return q @ k.transpose(-1, -2)

    q = torch.randn(1, 4, 8)
    prepared = qw.prepare_pt2e(export(Attention(), q, q), X86InductorQuantizer())
    (row,) = [r for r in qw.annotation_report(prepared, X86InductorQuantizer()).nodes if r.op == "aten.matmul.default"]
    assert row.status == "float" and "enable_matmul" in row.reason


def test_the_product_rows_declare_the_weight_on_axis_1():
    caps = {c.pattern: c for c in declared_capabilities()}
    assert {caps[p].weight.ch_axis for p in ("addmm", "mm", "matmul_weight")} == {1}
    assert caps["linear"].weight.ch_axis == 0
    assert caps["addmm"].bias is not None and caps["mm"].bias is None

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

aten = torch.ops.aten


class BasicBlock(nn.Module):
    """torchvision's BasicBlock, as it writes it (``nn.ReLU(inplace=True)``, ``out += identity``)."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = self.relu(self.stem(x))
        out = self.relu(self.conv1(identity))
        out = self.conv2(out)
        out += identity
        return self.relu(out)


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D: weight stored [in, out], computed with addmm."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        size_out = (*x.size()[:-1], self.weight.size(-1))
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class Mlp(nn.Module):
    """GPT-2's MLP (two Conv1D) and a hand-written ``x @ W + b`` head."""

    def __init__(self):
        super().__init__()
        self.c_fc = Conv1D(32, 16)
        self.c_proj = Conv1D(16, 32)
        self.w = nn.Parameter(torch.randn(16, 8) * 0.1)
        self.b = nn.Parameter(torch.randn(8) * 0.1)

    def forward(self, x):
        return torch.relu(self.c_proj(torch.relu(self.c_fc(x)))) @ self.w + self.b


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

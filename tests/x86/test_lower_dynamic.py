"""quantweave_x86.lower on dynamically quantized models: run-time qparams as the converted model
chooses them (a range that holds 0), also on activations that are all positive (a softmax)."""

import torch
from torch._dynamo.utils import counters

import quantweave as qw
from quantweave.authoring import quantize_ops
from quantweave_x86 import X86InductorQuantizer, lower
from quantweave_x86._dynamic_qparams import choose_qparams_as_aten_ops
from tests.helpers import Snapshot, export


class SoftmaxHead(torch.nn.Module):
    """linear -> softmax (all positive) -> x * x (dynamically quantized inputs, no linear) and
    -> linear (an int8 linear on an all-positive dynamically quantized input)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.head = torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = torch.softmax(self.proj(x), -1)
        return p * p, self.head(p)


def test_dynamic_qparams_lowered_as_the_converted_model_chooses_them():
    # the fuzz's failure (docs/fuzzing.md): torch 2.13 inductor's choose_qparams takes an
    # all-positive tensor's own [min, max], the op widens it to hold 0: 10 dB apart
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    prepared = qw.prepare_pt2e(export(SoftmaxHead(), x), X86InductorQuantizer(is_dynamic=True, reduce_range=True))
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    expected = converted(x)
    snapshot = Snapshot.of(converted)
    counters.clear()
    lowered = lower(converted, (x,))
    found = dict(counters["inductor"])
    assert not snapshot.differences(converted), snapshot.differences(converted)
    for want, got in zip(expected, lowered(x), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the dynamically quantized linears are still int8 kernels
    assert found.get("qlinear_weight_prepack_matcher_count", 0) == 2, found


def test_choose_qparams_rewrite_computes_the_ops_scale_and_zero_point():
    quantize_ops()  # registers torch.ops.quantized_decomposed
    choose = torch.ops.quantized_decomposed.choose_qparams.tensor

    class Pick(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            scale, zero_point = choose(x, 0, 127, 2.0**-12, torch.uint8)
            return scale, zero_point

    gm = export(Pick(), torch.rand(4))
    rewritten = choose_qparams_as_aten_ops(gm)
    assert not any(n.target == choose for n in rewritten.graph.nodes)
    assert any(n.target == choose for n in gm.graph.nodes), "the caller's graph was changed"
    for x in (torch.rand(4) + 0.5, -torch.rand(4) - 0.5, torch.randn(4), torch.zeros(4)):
        want_scale, want_zp = choose(x, 0, 127, 2.0**-12, torch.uint8)
        scale, zp = rewritten(x)
        assert scale.dtype == torch.float64 and zp.dtype == torch.int64
        assert float(scale) == float(want_scale) and int(zp) == int(want_zp), (x, scale, zp, want_scale, want_zp)

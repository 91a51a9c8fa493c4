"""quantweave_x86.lower on quantized conv1d: Whisper's encoder stem compiles and runs (issue #24).

torch 2.13's fake kernel of inductor's int8 conv (``onednn.qconv_pointwise``) records a conv1d's
output length as if its kernel were 1; an op after the conv that checks the length (Whisper's
``+ positions``, a flatten into a fixed width) failed to compile. ``lower`` compiles each quantized
conv1d as the equivalent conv2d, still an int8 conv.
"""

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import quantweave as qw
from quantweave.testing.inspect import sqnr
from quantweave_x86 import X86InductorQuantizer, lower
from quantweave_x86._conv1d import quantized_conv1ds_as_conv2ds
from tests.helpers import export


class WhisperStem(torch.nn.Module):
    """Whisper's encoder up to its first layer (conv1d, activation, strided conv1d, gelu, permute,
    ``+ positions``), with a relu after the first conv (fused into it, int8 out) and a dilated,
    grouped second conv without bias."""

    def __init__(self, mels: int = 8, width: int = 16, frames: int = 16) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv1d(mels, width, 3, padding=1)
        self.conv2 = torch.nn.Conv1d(width, width, 3, stride=2, padding=2, dilation=2, groups=2, bias=False)
        self.positions = torch.nn.Parameter(torch.randn(frames // 2, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(self.conv2(torch.relu(self.conv1(x))))
        return y.permute(0, 2, 1) + self.positions


def _lowered(model: torch.nn.Module, x: torch.Tensor):
    model = model.eval()
    prepared = qw.prepare_pt2e(export(model, x), X86InductorQuantizer(reduce_range=True))
    for _ in range(3):
        prepared(torch.randn_like(x))
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    before = (converted.code, dict(converted.state_dict(keep_vars=True)))
    counters.clear()
    lowered = lower(converted, (x,))
    found = dict(counters["inductor"])
    return model, converted, before, lowered, found


@pytest.fixture(scope="module")
def whisper_stem():
    torch.manual_seed(0)
    return (*_lowered(WhisperStem(), torch.randn(1, 8, 16)), torch.randn(1, 8, 16))


def test_whisper_stem_lowers_to_int8_convs_and_runs(whisper_stem):
    model, converted, _, lowered, found, x = whisper_stem
    out = lowered(x)
    assert out.shape == (1, 8, 16)
    assert found["qconv_weight_prepack_matcher_count"] == 2  # both convs are oneDNN int8 convs
    assert found["qconv_unary_matcher_count"] == 1  # relu and its int8 output fused into conv1
    with torch.no_grad():
        assert sqnr(converted(x), out) > 25
        assert sqnr(model(x), out) > 25


def test_lowering_leaves_the_converted_model_alone(whisper_stem):
    _, converted, (code, state), _, _, _ = whisper_stem
    assert converted.code == code
    now = converted.state_dict(keep_vars=True)
    assert now.keys() == state.keys()
    assert all(now[k] is v for k, v in state.items())
    assert any(n.target == torch.ops.aten.conv1d.default for n in converted.graph.nodes)


def test_conv1d_as_conv2d_is_the_same_values_without_compiling(whisper_stem):
    _, converted, _, _, _, x = whisper_stem
    rewritten = quantized_conv1ds_as_conv2ds(converted)
    targets = [n.target for n in rewritten.graph.nodes]
    assert torch.ops.aten.conv1d.default not in targets
    assert targets.count(torch.ops.aten.conv2d.default) == 2
    with torch.no_grad():
        torch.testing.assert_close(rewritten(x), converted(x), rtol=1e-5, atol=1e-5)
    plain = export(torch.nn.Sequential(torch.nn.Conv1d(2, 2, 3)).eval(), torch.randn(1, 2, 8))
    assert quantized_conv1ds_as_conv2ds(plain) is plain  # a float conv1d is left as it is

"""The core patterns' probes: one small model per pattern, each containing one instance of
it, and a sweep model where many patterns meet.

Ops that backends quantize only behind a quantized producer (pooling, shape ops, cat) are
probed behind a ``conv2d``; ``relu`` / ``hardtanh`` / ``relu6`` on their own behind a
``cat`` of two convs, which no backend fuses them with (see
:data:`quantweave.vocabulary.PRODUCERS`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .spec import ProbeFactory

__all__ = ["PROBES", "sweep_probe"]


class _Probe(nn.Module):
    def __init__(self, forward: Callable[..., torch.Tensor], **modules: nn.Module) -> None:
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)
        self._forward = forward

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self._forward(self, *inputs)


def _img(c: int = 3, s: int = 12) -> torch.Tensor:
    return torch.randn(1, c, s, s)


def _conv_then(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    return lambda: (_Probe(lambda m, x: fn(m.conv(x)), conv=nn.Conv2d(3, 8, 3)), (_img(),))


def _conv_bn_then(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    return lambda: (
        _Probe(lambda m, x: fn(m.bn(m.conv(x))), conv=nn.Conv2d(3, 8, 3), bn=nn.BatchNorm2d(8)),
        (_img(),),
    )


def _linear_then(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    return lambda: (_Probe(lambda m, x: fn(m.fc(x)), fc=nn.Linear(16, 8)), (torch.randn(2, 16),))


def _cat_then(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    return lambda: (
        _Probe(
            lambda m, x: fn(torch.cat([m.conv1(x), m.conv2(x)], 1)), conv1=nn.Conv2d(3, 4, 3), conv2=nn.Conv2d(3, 4, 3)
        ),
        (_img(),),
    )


class _Weighted(nn.Module):
    """A constant weight stored [in, out] (as GPT-2's ``Conv1D`` stores it) and a bias,
    multiplied by ``forward``'s function (``torch.addmm``, ``torch.mm``, ``x @ W``)."""

    def __init__(self, forward: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 8) * 0.25)
        self.bias = nn.Parameter(torch.randn(8) * 0.1)
        self._forward = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(self, x)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


#: pattern -> factory of (probe model, example inputs); one per vocabulary pattern.
PROBES: dict[str, ProbeFactory] = {
    "conv1d": lambda: (_Probe(lambda m, x: m.conv(x), conv=nn.Conv1d(4, 8, 3)), (torch.randn(1, 4, 16),)),
    "conv1d_relu": lambda: (_Probe(lambda m, x: F.relu(m.conv(x)), conv=nn.Conv1d(4, 8, 3)), (torch.randn(1, 4, 16),)),
    "conv2d": _conv_then(_identity),
    "conv2d_relu": _conv_then(F.relu),
    "conv2d_hardtanh": _conv_then(F.hardtanh),
    "conv2d_relu6": _conv_then(F.relu6),
    "conv2d_hardswish": _conv_then(F.hardswish),
    "conv2d_silu": _conv_then(F.silu),
    "conv2d_add": lambda: (
        _Probe(lambda m, x, y: m.conv(x) + y, conv=nn.Conv2d(3, 8, 3)),
        (_img(), torch.randn(1, 8, 10, 10)),
    ),
    "conv2d_add_relu": lambda: (
        _Probe(lambda m, x, y: F.relu(m.conv(x) + y), conv=nn.Conv2d(3, 8, 3)),
        (_img(), torch.randn(1, 8, 10, 10)),
    ),
    "conv2d_bn": _conv_bn_then(_identity),
    "conv2d_bn_relu": _conv_bn_then(F.relu),
    "conv2d_bn_hardtanh": _conv_bn_then(F.hardtanh),
    "conv2d_bn_relu6": _conv_bn_then(F.relu6),
    "conv2d_bn_hardswish": _conv_bn_then(F.hardswish),
    "conv2d_bn_silu": _conv_bn_then(F.silu),
    "conv2d_bn_add": lambda: (
        _Probe(lambda m, x, y: m.bn(m.conv(x)) + y, conv=nn.Conv2d(3, 8, 3), bn=nn.BatchNorm2d(8)),
        (_img(), torch.randn(1, 8, 10, 10)),
    ),
    "conv2d_bn_add_relu": lambda: (
        _Probe(lambda m, x, y: F.relu(m.bn(m.conv(x)) + y), conv=nn.Conv2d(3, 8, 3), bn=nn.BatchNorm2d(8)),
        (_img(), torch.randn(1, 8, 10, 10)),
    ),
    "conv_transpose2d": lambda: (_Probe(lambda m, x: m.conv(x), conv=nn.ConvTranspose2d(3, 8, 3)), (_img(),)),
    "conv_transpose2d_relu": lambda: (
        _Probe(lambda m, x: F.relu(m.conv(x)), conv=nn.ConvTranspose2d(3, 8, 3)),
        (_img(),),
    ),
    "conv_transpose2d_bn": lambda: (
        _Probe(lambda m, x: m.bn(m.conv(x)), conv=nn.ConvTranspose2d(3, 8, 3), bn=nn.BatchNorm2d(8)),
        (_img(),),
    ),
    "conv_transpose2d_bn_relu": lambda: (
        _Probe(lambda m, x: F.relu(m.bn(m.conv(x))), conv=nn.ConvTranspose2d(3, 8, 3), bn=nn.BatchNorm2d(8)),
        (_img(),),
    ),
    "linear": _linear_then(_identity),
    "linear_relu": _linear_then(F.relu),
    "linear_leaky_relu": _linear_then(F.leaky_relu),
    "linear_tanh": _linear_then(torch.tanh),
    "linear_gelu": _linear_then(F.gelu),
    "linear_add": lambda: (
        _Probe(lambda m, x, y: m.fc(x) + y, fc=nn.Linear(16, 8)),
        (torch.randn(2, 16), torch.randn(2, 8)),
    ),
    "linear_add_relu": lambda: (
        _Probe(lambda m, x, y: F.relu(m.fc(x) + y), fc=nn.Linear(16, 8)),
        (torch.randn(2, 16), torch.randn(2, 8)),
    ),
    "matmul": lambda: (_Probe(lambda m, x, y: torch.matmul(x, y)), (torch.randn(2, 4, 8), torch.randn(2, 8, 4))),
    # an activation times a constant [in, out] weight: linear, written as GPT-2's Conv1D
    # (addmm), without bias (mm) and by hand (x @ W, which export keeps as matmul)
    "addmm": lambda: (_Weighted(lambda m, x: torch.addmm(m.bias, x, m.weight)), (torch.randn(2, 16),)),
    "mm": lambda: (_Weighted(lambda m, x: torch.mm(x, m.weight)), (torch.randn(2, 16),)),
    "matmul_weight": lambda: (_Weighted(lambda m, x: x @ m.weight), (torch.randn(1, 3, 16),)),
    "add": lambda: (_Probe(lambda m, x, y: x + y), (torch.randn(2, 8), torch.randn(2, 8))),
    "add_relu": lambda: (_Probe(lambda m, x, y: F.relu(x + y)), (torch.randn(2, 8), torch.randn(2, 8))),
    "mul": lambda: (_Probe(lambda m, x, y: x * y), (torch.randn(2, 8), torch.randn(2, 8))),
    "mul_relu": lambda: (_Probe(lambda m, x, y: F.relu(x * y)), (torch.randn(2, 8), torch.randn(2, 8))),
    # cat and flatten take quantized producers (and flatten a quantized consumer): backends
    # that only propagate quantization through these ops (x86) annotate them only then
    "cat": lambda: (
        _Probe(lambda m, x: torch.cat([m.conv1(x), m.conv2(x)], 1), conv1=nn.Conv2d(3, 4, 3), conv2=nn.Conv2d(3, 4, 3)),
        (_img(),),
    ),
    "max_pool2d": _conv_then(lambda t: F.max_pool2d(t, 2)),
    "avg_pool2d": _conv_then(lambda t: F.avg_pool2d(t, 2)),
    "adaptive_avg_pool2d": _conv_then(lambda t: F.adaptive_avg_pool2d(t, 1)),
    "flatten": lambda: (
        _Probe(lambda m, x: m.fc(torch.flatten(m.conv(x), 1)), conv=nn.Conv2d(3, 2, 3), fc=nn.Linear(200, 4)),
        (_img(),),
    ),
    # shape and reduction ops take a conv's output: backends annotate them to share their
    # input's qparams only when that input is quantized
    "mean": _conv_then(lambda t: t.mean((2, 3), keepdim=True)),
    "permute": _conv_then(lambda t: t.permute(0, 2, 3, 1)),
    "transpose": _conv_then(lambda t: t.transpose(1, 2)),
    "view": _conv_then(lambda t: t.view(1, -1)),
    "reshape": _conv_then(lambda t: t.reshape(1, -1)),
    "squeeze": _conv_then(lambda t: t.squeeze(0)),
    "slice": _conv_then(lambda t: t[:, :4]),
    "dropout": lambda: (
        _Probe(lambda m, x: m.drop(m.conv(x)), conv=nn.Conv2d(3, 8, 3), drop=nn.Dropout(0.25)),
        (_img(),),
    ),
    # activations on their own take a cat of two convs: quantized by any backend that
    # quantizes cat, fused into it by none (quantizers that quantize relu only after a
    # quantized producer, input_from "any", annotate them here)
    "relu": _cat_then(F.relu),
    "hardtanh": _cat_then(F.hardtanh),
    "relu6": _cat_then(F.relu6),
    "sigmoid": lambda: (_Probe(lambda m, x: torch.sigmoid(x)), (torch.randn(2, 8),)),
    "softmax": lambda: (_Probe(lambda m, x: torch.softmax(x, -1)), (torch.randn(2, 8),)),
    # rows of 128 split into the groups (32, 64, 128) group-wise embedding quantizers use
    "embedding": lambda: (_Probe(lambda m, t: m.emb(t), emb=nn.Embedding(16, 128)), (torch.tensor([[1, 2, 3]]),)),
}


class _Sweep(nn.Module):
    """Many vocabulary ops in one graph, so that what a quantizer annotates where ops meet
    (not only on one-pattern probes) is held against its declaration."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.bn = nn.BatchNorm2d(8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = F.relu(self.bn(self.conv1(x)))
        b = F.max_pool2d(a, 2)
        c = F.hardtanh(self.conv2(b)) + b
        d = torch.cat([F.relu6(self.conv3(c)), c * torch.sigmoid(c)], 1)
        e = F.adaptive_avg_pool2d(d[:, :8], 1).flatten(1)
        f = F.gelu(self.fc1(self.norm(e)))
        g = torch.softmax(self.fc2(f) + y, -1)
        h = F.avg_pool2d(self.up(b), 2).mean((2, 3)).reshape(1, -1).permute(1, 0)
        return g, torch.matmul(g.transpose(0, 1), g), h.view(-1), F.silu(c).squeeze(0)


def sweep_probe() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The vocabulary sweep model and its example inputs."""
    return _Sweep(), (torch.randn(1, 3, 12, 12), torch.randn(1, 8))

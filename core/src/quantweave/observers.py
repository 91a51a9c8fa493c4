"""The single place quantweave takes observers and fake-quantizers from.

Everything else in quantweave imports observer classes from here. They are torch's
(``torch.ao.quantization``), imported through ``quantweave._modules.torch_compat`` -- the
one module that touches torch's private and deprecated API -- so a torch without them
needs one change, there. ``DerivedObserver``, the faster ``HistogramObserver`` search and
the calibration check are our own.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._modules.group_observer import PerGroupMinMaxObserver as PerGroupMinMaxObserver
from ._modules.torch_compat import (
    FakeQuantize,
    FakeQuantizeBase,
    FixedQParamsFakeQuantize,
    FixedQParamsObserver,
    FusedMovingAvgObsFakeQuantize,
    HistogramObserverHooks,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)

__all__ = [
    "DerivedObserver",
    "FakeQuantize",
    "FakeQuantizeBase",
    "FixedQParamsFakeQuantize",
    "FixedQParamsObserver",
    "FusedMovingAvgObsFakeQuantize",
    "HistogramObserver",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "ObserverBase",
    "PerChannelMinMaxObserver",
    "PlaceholderObserver",
    "is_observer_module",
    "is_calibrated",
]


def _to_float32(value: float) -> float:
    """Round a Python float to float32, as comparing it with a float32 tensor does."""
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result


class HistogramObserver(HistogramObserverHooks):
    """torch's HistogramObserver with the same min/max search run on Python floats.

    torch's search walks the cumulative histogram in steps of 1e-5 of the total and
    indexes a tensor at every step. This version makes the same comparisons (float32
    cumulative sums against thresholds rounded to float32, as tensor comparison does) on a
    list, so it returns identical qparams, several times faster.
    """

    def search_min_max(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.histogram.size()[0] != self.bins:
            raise AssertionError("bins mismatch")
        bin_width = (self.max_val - self.min_val) / self.bins
        total = torch.sum(self.histogram).item()
        csum = torch.cumsum(self.histogram, dim=0).tolist()
        stepsize = 1e-5
        alpha, beta = 0.0, 1.0
        start_bin, end_bin = 0, self.bins - 1
        norm_min = float("inf")
        while alpha < beta:
            next_alpha = alpha + stepsize
            next_beta = beta - stepsize
            low, high = _to_float32(next_alpha * total), _to_float32(next_beta * total)
            left, right = start_bin, end_bin
            while left < end_bin and csum[left] < low:
                left += 1
            while right > start_bin and csum[right] > high:
                right -= 1
            next_start_bin, next_end_bin = start_bin, end_bin
            if (left - start_bin) > (end_bin - right):
                next_start_bin = left
                alpha = next_alpha
            else:
                next_end_bin = right
                beta = next_beta
            if next_start_bin == start_bin and next_end_bin == end_bin:
                continue
            norm = self.quantization_error(next_start_bin, next_end_bin)
            if norm > norm_min:
                break
            norm_min = norm
            start_bin, end_bin = next_start_bin, next_end_bin
        new_min = self.min_val + bin_width * start_bin
        new_max = self.min_val + bin_width * (end_bin + 1)
        return new_min, new_max


class DerivedObserver(ObserverBase):
    """Observes nothing; its qparams are ``derive_qparams_fn(sources)``.

    ``sources`` are the observers of the edges/nodes the spec derives from. They are kept
    in a plain list (not registered as submodules) so they are owned by the graph once.
    """

    def __init__(
        self,
        sources: Sequence[torch.nn.Module],
        derive_qparams_fn: Callable[[list[Any]], tuple[torch.Tensor, torch.Tensor]],
        dtype: torch.dtype,
        quant_min: int,
        quant_max: int,
        qscheme: torch.qscheme,
        ch_axis: int | None = None,
    ) -> None:
        super().__init__(dtype=dtype, is_dynamic=False)
        self.sources = list(sources)
        self.derive_qparams_fn = derive_qparams_fn
        self.quant_min = quant_min
        self.quant_max = quant_max
        self.qscheme = qscheme
        self.ch_axis = ch_axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return self.derive_qparams_fn(self.sources)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, qscheme={self.qscheme}, sources={len(self.sources)}"


def is_observer_module(module: object) -> bool:
    """True for observer and fake-quantize modules that convert turns into q/dq ops."""
    return isinstance(module, (ObserverBase, FakeQuantizeBase))


def is_calibrated(module: torch.nn.Module) -> bool:
    """False when an observer that learns from data has seen none.

    Fixed, placeholder (dynamic) and derived observers need no data of their own.
    """
    if isinstance(module, FakeQuantizeBase):
        inner = getattr(module, "activation_post_process", None)
        return inner is None or is_calibrated(inner)
    if isinstance(module, (FixedQParamsObserver, PlaceholderObserver, DerivedObserver)):
        return True
    min_val = getattr(module, "min_val", None)
    max_val = getattr(module, "max_val", None)
    if not isinstance(min_val, torch.Tensor) or not isinstance(max_val, torch.Tensor):
        return True
    if min_val.numel() == 0 or max_val.numel() == 0:
        return False
    return bool(torch.isfinite(min_val).all() and torch.isfinite(max_val).all())

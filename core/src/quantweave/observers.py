"""The single place quantweave takes observers and fake-quantizers from.

Everything else in quantweave imports observer classes from here. They are torch's
(``torch.ao.quantization``), imported through ``quantweave._modules.torch_compat`` -- the
one module that touches torch's private and deprecated API -- so a torch without them
needs one change, there. ``DerivedObserver``, the faster ``HistogramObserver`` search and
the calibration check are our own.
"""

from __future__ import annotations

import math
import struct
import threading
import weakref
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
    PlaceholderObserver,
)
from ._modules.torch_compat import PerChannelMinMaxObserver as _TorchPerChannelMinMaxObserver

__all__ = [
    "DerivedObserver",
    "FastHistogramObserver",
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
    "exact_histc",
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

    # -- the same histograms as torch's, computed faster (torch's ``forward`` calls these) --

    def reset_histogram(self, x: torch.Tensor, min_val: torch.Tensor, max_val: torch.Tensor) -> None:
        """torch's first-batch reset, with :func:`exact_histc` for ``torch.histc``."""
        self.min_val.resize_(min_val.shape)
        self.min_val.copy_(min_val)
        self.max_val.resize_(max_val.shape)
        self.max_val.copy_(max_val)
        if min_val.numel() != 1 or max_val.numel() != 1:
            raise AssertionError("histogram min/max values must be scalar.")
        new_histogram = exact_histc(x, self.bins, float(min_val), float(max_val), within=True)
        self.histogram.detach_().resize_(new_histogram.shape)
        self.histogram.copy_(new_histogram)

    def _upscale_histogram(
        self,
        histogram: torch.Tensor,
        orig_min: torch.Tensor,
        orig_max: torch.Tensor,
        update_min: torch.Tensor,
        update_max: torch.Tensor,
    ) -> torch.Tensor:
        """torch's re-binning of the histogram onto a wider range (when a batch widens it),
        with the bucket of each of the ``bins * upsample_rate`` sorted mid-points found by
        searching the ``bins + 1`` boundaries among them (not each mid-point among the
        boundaries): the same comparisons, the same assignments, the same ``bincount``."""
        rate = self.upsample_rate
        # each bin's count / rate, rate times in a row (repeat_interleave's values)
        upsampled = histogram.unsqueeze(1).expand(-1, rate).reshape(-1) / rate
        if not _finite_float32_ranges(orig_min, orig_max, update_min, update_max):
            # a range beyond float32 (linspace overflows): torch's own re-binning
            return super()._upscale_histogram(histogram, orig_min, orig_max, update_min, update_max)
        bin_size = (orig_max - orig_min) / (self.bins * rate)
        mids = (
            torch.linspace(orig_min, orig_max, self.bins * rate + 1, device=orig_min.device)[:-1].to(upsampled.device)
            + 0.5 * bin_size
        )
        boundaries = torch.linspace(update_min, update_max, self.bins + 1, device=update_min.device).to(
            upsampled.device
        )
        if not (bool((mids[1:] >= mids[:-1]).all()) and bool((boundaries[1:] >= boundaries[:-1]).all())):
            return super()._upscale_histogram(histogram, orig_min, orig_max, update_min, update_max)
        # torch: bucketize(m, boundaries, right=True) - 1, i.e. (number of boundaries <= m) - 1,
        # clamped to [0, bins - 1]. Mid-points are sorted, so boundary j is <= exactly the
        # mid-points from position searchsorted(mids, b_j) on: count them with a running sum.
        first_not_below = torch.searchsorted(mids, boundaries, side="left")
        starts = torch.bincount(first_not_below, minlength=len(mids) + 1)[: len(mids)]
        buckets = torch.cumsum(starts, 0).sub_(1).clamp_(0, self.bins - 1)
        return torch.bincount(buckets, weights=upsampled, minlength=self.bins)


class FastHistogramObserver(HistogramObserver):
    """:class:`HistogramObserver` whose ``forward`` also computes each batch's histogram
    with :func:`exact_histc` (the same counts as ``torch.histc``, about 3x faster): the
    same state, histograms and qparams as torch's HistogramObserver (tested), and the
    cheapest calibration quantweave offers with histogram activations.

    Opt-in, not the default: :mod:`quantweave.distributed` merges only observers whose
    ``forward`` is torch's, so models calibrated across processes keep
    :class:`HistogramObserver`."""

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach()
        x_min, x_max = torch.aminmax(x)
        lo, hi = float(x_min), float(x_max)
        if not (math.isfinite(lo) and math.isfinite(hi)) or not _exact_histc_applies(x):
            return super().forward(x_orig)  # torch's path (inf / nan filtering, other dtypes and devices)
        current_min, current_max = float(self.min_val), float(self.max_val)
        if current_min == math.inf or current_max == -math.inf:
            self.reset_histogram(x, x_min, x_max)
        elif lo >= current_min and hi <= current_max:  # the range holds: add this batch's counts
            self.histogram.add_(exact_histc(x, self.bins, current_min, current_max, within=True))
        else:
            new_min = torch.min(self.min_val, x_min).detach()
            new_max = torch.max(self.max_val, x_max).detach()
            update = exact_histc(x, self.bins, float(new_min), float(new_max), within=True)
            combined = self._combine_histograms(self.histogram, self.min_val, self.max_val, update, new_min, new_max)
            self.histogram.detach_().resize_(combined.shape)
            self.histogram.copy_(combined)
            self.min_val.detach_().resize_(new_min.shape)
            self.min_val.copy_(new_min)
            self.max_val.detach_().resize_(new_max.shape)
            self.max_val.copy_(new_max)
        return x_orig


def _finite_float32_ranges(*ends: torch.Tensor) -> bool:
    """True when each (start, end) pair and its width are finite in float32."""
    values = [float(v) for v in ends]
    try:
        widths = [_to_float32(values[i + 1] - values[i]) for i in range(0, len(values), 2)]
    except OverflowError:
        return False
    return all(math.isfinite(v) for v in values + widths)


def _exact_histc_applies(x: torch.Tensor) -> bool:
    # float32 on CPU; fewer than 2**24 elements (torch.histc counts in float32, which stops
    # counting exactly at 2**24 per bin)
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() < 2**24


def exact_histc(x: torch.Tensor, bins: int, lo: float, hi: float, *, within: bool = False) -> torch.Tensor:
    """``torch.histc(x, bins, min=lo, max=hi)`` -- the same float32 counts -- computed with
    vectorised tensor ops and ``bincount``, about 3x faster on CPU.

    torch's CPU kernel (histc's linear-interpolation path) puts an element ``e`` of
    ``[L, R]`` (the float32 edges; ``lo == hi`` widens them by 1 each side) into bin
    ``int(((e - L) * bins) / (R - L))`` in float32 arithmetic, the last bin keeping ``R``;
    this computes the same expression elementwise. ``within=True``: the caller knows every
    element is in ``[lo, hi]`` (skips a check). Falls back to ``torch.histc`` where that
    identity is not guaranteed: not float32 on CPU, 2**24 elements or more, a range that is
    not finite and positive in float32, or elements outside it."""
    if not _exact_histc_applies(x):
        return torch.histc(x, bins, min=lo, max=hi)
    if lo == hi:
        lo, hi = lo - 1.0, hi + 1.0
    # the kernel's float32 edges and width (double rounding of float32 operands is exact)
    left, right = _f32(lo), _f32(hi)
    width = _f32(right - left)
    flat = x.reshape(-1)
    if not (math.isfinite(left) and math.isfinite(width) and width > 0) or len(flat) == 0:
        return torch.histc(x, bins, min=lo, max=hi)
    if not within:
        low, high = torch.aminmax(flat)
        if not (float(low) >= left and float(high) <= right):  # the kernel skips elements outside
            return torch.histc(x, bins, min=lo, max=hi)
    scaled, position = _scratch(len(flat), torch.int16 if bins < 2**15 - 1 else torch.int32)
    torch.sub(flat, left, out=scaled)  # left is a float32 value: the scalar converts exactly
    step = _f32(width / bins)
    if bins & (bins - 1) == 0 and step * bins == width and math.isfinite(_f32(width * bins)):
        # bins a power of two, width / bins exact, (e - L) * bins never overflowing: the
        # kernel's ((e - L) * bins) / width multiplies exactly, so it equals (e - L) / step
        scaled.div_(step)
    else:
        scaled.mul_(bins).div_(width)
    position.copy_(scaled)  # float -> integer truncates, as the kernel's cast does (values in [0, bins])
    position.clamp_(max=bins - 1)  # the last bin keeps the right edge
    return torch.bincount(position, minlength=bins).to(torch.float32)


def _f32(value: float) -> float:
    """``value`` rounded to float32 (inf beyond its range)."""
    try:
        return _to_float32(value)
    except OverflowError:
        return math.copysign(math.inf, value)


_SCRATCH = threading.local()


def _scratch(n: int, index_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Reusable float32 and integer work buffers of ``n`` elements (per thread): calibration
    would otherwise allocate (and page-fault) two activation-sized tensors per observer call.
    int16 bin indices when they fit: ``bincount`` and the cast are faster on them."""
    cache: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = _SCRATCH.__dict__.setdefault("buffers", {})
    buffers = cache.get(index_dtype)
    if buffers is None or len(buffers[0]) < n:
        buffers = (torch.empty(n, dtype=torch.float32), torch.empty(n, dtype=index_dtype))
        cache[index_dtype] = buffers
    return buffers[0][:n], buffers[1][:n]


class PerChannelMinMaxObserver(_TorchPerChannelMinMaxObserver):
    """torch's PerChannelMinMaxObserver (``forward`` is torch's), with the same state
    computed faster: its per-channel ``_forward``

    - skips a tensor it observed last time that has not changed since (the same tensor
      object at the same version counter, and its own min/max buffers untouched since):
      a weight is observed on every calibration batch, and the minimum of a minimum with
      the same values is that minimum;
    - reduces with ``torch.amin`` / ``torch.amax`` along the channel rows instead of
      ``torch.aminmax(..., dim=1)`` (the same values: both are exact and propagate NaN;
      on CPU ``aminmax`` along a dimension is about 20x slower).

    ``tests/core/test_observers.py`` checks min/max and qparams against torch's class.
    """

    _last_seen: tuple[Any, ...] | None = None

    def _forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if x_orig.numel() == 0:
            return x_orig
        if _unchanged_since(self, x_orig):
            return x_orig
        x = x_orig.detach()
        min_val, max_val = self.min_val, self.max_val
        axes = list(range(x.dim()))
        axes[self.ch_axis], axes[0] = 0, self.ch_axis
        y = torch.flatten(x.permute(axes).to(self.min_val.dtype), start_dim=1)
        if min_val.numel() == 0 or max_val.numel() == 0:
            min_val, max_val = torch.amin(y, dim=1), torch.amax(y, dim=1)
        else:
            min_val = torch.min(torch.amin(y, dim=1), min_val)
            max_val = torch.max(torch.amax(y, dim=1), max_val)
        self.min_val.resize_(min_val.shape)
        self.max_val.resize_(max_val.shape)
        self.min_val.copy_(min_val)
        self.max_val.copy_(max_val)
        _remember(self, x_orig)
        return x_orig


def _state_key(observer: Any, x: torch.Tensor) -> tuple[Any, ...] | None:
    """What must be unchanged for observing ``x`` again to be a no-op (None: cannot tell,
    e.g. inference tensors carry no version counter)."""
    try:
        return (
            weakref.ref(x),
            x._version,
            weakref.ref(observer.min_val),
            observer.min_val._version,
            weakref.ref(observer.max_val),
            observer.max_val._version,
        )
    except (RuntimeError, TypeError):
        return None


def _unchanged_since(observer: Any, x: torch.Tensor) -> bool:
    """True when ``observer`` last observed this very tensor, and neither the tensor nor the
    observer's min/max buffers changed since (same objects, same version counters)."""
    last = observer._last_seen
    if last is None:
        return False
    now = _state_key(observer, x)
    if now is None:
        return False
    refs_same = all(now[i]() is last[i]() for i in (0, 2, 4))
    return refs_same and (now[1], now[3], now[5]) == (last[1], last[3], last[5])


def _remember(observer: Any, x: torch.Tensor) -> None:
    observer._last_seen = _state_key(observer, x)


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

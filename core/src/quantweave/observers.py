"""The single place quantweave takes observers and fake-quantizers from.

Everything else in quantweave imports observer classes from here. They are torch's
(``torch.ao.quantization``), imported through ``quantweave._modules.torch_compat`` -- the
one module that touches torch's private and deprecated API -- so a torch without them
needs one change, there. ``DerivedObserver``, the faster ``HistogramObserver`` (torch's
state and qparams, bit for bit) and ``PerChannelMinMaxObserver``, and the calibration check
are our own.
"""

from __future__ import annotations

import functools
import math
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._modules.finite import all_finite_pair
from ._modules.group_observer import PerGroupMinMaxObserver as PerGroupMinMaxObserver
from ._modules.histogram_search import beta_after_still_steps as _beta_after_still_steps
from ._modules.observed_once import remember as _remember
from ._modules.observed_once import unchanged_since as _unchanged_since
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
    segment_sum,
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
    "is_fake_quant_module",
    "is_calibrated",
]


def _to_float32(value: float) -> float:
    """Round a Python float to float32, as comparing it with a float32 tensor does."""
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result


class HistogramObserver(HistogramObserverHooks):
    """torch's HistogramObserver -- the same state (``min_val``, ``max_val``,
    ``histogram``) after every batch and the same qparams, bit for bit (tested) -- computed
    several times faster:

    - ``forward`` counts each batch with :func:`exact_histc` (the counts of ``torch.histc``
      at about a fifth of its cost) and reads the range as Python floats instead of
      comparing tensors;
    - when a batch widens the range, the histogram is re-binned onto it with the same
      mid-point assignment and the same float32 sums as torch's, without its per-element
      bucket search (:meth:`_upscale_histogram`);
    - the min/max search (:meth:`search_min_max`) makes torch's comparisons on a list;
      where torch's float32 L2 error overflows (values beyond ~7e12: NaN, and torch's
      search collapses the range), the error is taken in float64 -- the one place the
      qparams differ from torch's, on purpose.

    Inputs the fast path does not cover (not float32 on CPU, 2**24 elements or more,
    infinities or NaN, a state that is not float32 on CPU) take torch's own code. It is the
    observer of every quantweave recipe with histogram activations, and
    :mod:`quantweave.distributed` merges it like torch's. ``FastHistogramObserver`` is
    another name for it (it was the opt-in class before it became the default).
    """

    #: batches with NaN or infinite values seen (torch's code drops infinities, fails on NaN):
    #: ``quantweave.calibrate`` reads it to name the observer
    non_finite_batches: int = 0

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach()
        min_val, max_val, histogram = self.min_val, self.max_val, self.histogram
        if not (_exact_histc_applies(x) and _float32_cpu_state(min_val, max_val, histogram, self.bins)):
            if x.is_floating_point() and not bool(torch.isfinite(x).all()):
                self.non_finite_batches += 1
            return super().forward(x_orig)  # torch's path (other dtypes and devices)
        x_min, x_max = torch.aminmax(x)
        lo, hi = x_min.item(), x_max.item()
        current_min, current_max = min_val.item(), max_val.item()
        if not (math.isfinite(lo) and math.isfinite(hi)):
            self.non_finite_batches += 1
            return super().forward(x_orig)  # torch's path: it drops infinities (with a warning)
        if current_min == math.inf or current_max == -math.inf:  # torch's "uninitialized"
            self._reset(x.reshape(-1), x_min, x_max, lo, hi)
        elif not (math.isfinite(current_min) and math.isfinite(current_max)):
            return super().forward(x_orig)  # a state torch's code alone defines (NaN)
        elif lo >= current_min and hi <= current_max:  # the range holds: add this batch's counts
            counts = _histc_counts(x.reshape(-1), self.bins, current_min, current_max)
            histogram.add_(counts)  # int64 counts (< 2**24, exact in float32) added in float32
        else:
            self._widen(x, x_min, x_max, current_min, current_max)
        return x_orig

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
            if next_start_bin == start_bin and next_end_bin == end_bin:  # a still step: skip the run
                beta = _beta_after_still_steps(alpha, beta, stepsize, total, csum[end_bin], end_bin > start_bin)
                continue
            norm = self.quantization_error(next_start_bin, next_end_bin)
            if norm > norm_min:
                break
            norm_min = norm
            start_bin, end_bin = next_start_bin, next_end_bin
        new_min = self.min_val + bin_width * start_bin
        new_max = self.min_val + bin_width * (end_bin + 1)
        return new_min, new_max

    def _reset(self, flat: torch.Tensor, x_min: torch.Tensor, x_max: torch.Tensor, lo: float, hi: float) -> None:
        """torch's first batch: the range is the batch's, the histogram its counts."""
        counts = _histc_counts(flat, self.bins, lo, hi)
        self.min_val.resize_(x_min.shape)
        self.min_val.copy_(x_min)
        self.max_val.resize_(x_max.shape)
        self.max_val.copy_(x_max)
        self.histogram.copy_(counts)

    def _widen(
        self, x: torch.Tensor, x_min: torch.Tensor, x_max: torch.Tensor, current_min: float, current_max: float
    ) -> None:
        """torch's update when the batch widens the range: the batch counted on the new
        range, plus the histogram re-binned onto it."""
        min_val, max_val = self.min_val, self.max_val
        new_min = torch.min(min_val, x_min)  # tensor ops, as torch: the same value and shape
        new_max = torch.max(max_val, x_max)
        update = _histc_counts(x.reshape(-1), self.bins, new_min.item(), new_max.item()).to(torch.float32)
        if current_min == current_max:  # one value seen so far: torch moves its mass into one bin
            combined = self._combine_histograms(self.histogram, min_val, max_val, update, new_min, new_max)
        else:  # torch: update + re-binned histogram (float addition commutes)
            combined = update.add_(self._upscale_histogram(self.histogram, min_val, max_val, new_min, new_max))
        self.histogram.detach_().resize_(combined.shape)
        self.histogram.copy_(combined)
        min_val.detach_().resize_(new_min.shape)
        min_val.copy_(new_min)
        max_val.detach_().resize_(new_max.shape)
        max_val.copy_(new_max)

    def reset_histogram(self, x: torch.Tensor, min_val: torch.Tensor, max_val: torch.Tensor) -> None:
        """torch's first-batch reset (called by torch's ``forward``), with
        :func:`exact_histc` for ``torch.histc``."""
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
        """torch's re-binning of the histogram onto a wider range (when a batch widens it).

        torch splits each bin into ``upsample_rate`` parts of equal mass, finds the new bin
        of each part's mid-point (``bucketize`` among the new boundaries, clamped) and sums
        the parts per new bin in index order (``bincount`` with float32 weights). Here: the
        same mid-points and boundaries (the same ``linspace`` calls); since both are sorted
        (checked), the parts of a new bin are a contiguous run, whose ends are found by
        searching the ``bins + 1`` boundaries among the mid-points (not each mid-point among
        the boundaries), and each run is summed in index order from 0.0 in float32 -- the
        same additions in the same order as ``bincount``, so the same bits."""
        fast = self._rebin_runs(histogram, orig_min, orig_max, update_min, update_max)
        if fast is None:  # a range or state the identity is not guaranteed for: torch's code
            return super()._upscale_histogram(histogram, orig_min, orig_max, update_min, update_max)
        return fast

    def _rebin_runs(
        self,
        histogram: torch.Tensor,
        orig_min: torch.Tensor,
        orig_max: torch.Tensor,
        update_min: torch.Tensor,
        update_max: torch.Tensor,
    ) -> torch.Tensor | None:
        bins, rate = int(self.bins), int(self.upsample_rate)
        tensors = (histogram, orig_min, orig_max, update_min, update_max)
        if torch.get_default_dtype() != torch.float32 or not all(
            t.dtype == torch.float32 and t.is_cpu for t in tensors
        ):
            return None
        if histogram.shape != (bins,) or not _finite_float32_ranges(orig_min, orig_max, update_min, update_max):
            return None  # a range beyond float32 (linspace overflows)
        parts = bins * rate
        bin_size = (orig_max - orig_min) / parts  # float32, as torch computes it
        padded = _mid_points_buffer(parts)  # [-inf, mid-points..., +inf]
        torch.linspace(orig_min, orig_max, parts + 1, out=padded[1 : parts + 2])
        mids = padded[1 : parts + 1]
        mids.add_(0.5 * bin_size)
        padded[parts + 1] = math.inf
        boundaries = torch.linspace(update_min, update_max, bins + 1)
        if not (bool(mids.diff().min() >= 0) and bool(boundaries.diff().min() >= 0)):
            return None
        # torch: bucket(k) = clamp(#{j: boundaries[j] <= mids[k]} - 1, 0, bins - 1). With both
        # sorted, boundaries[j] <= mids[k] iff k >= first[j] (the number of mid-points below
        # boundary j), so new bin 0 takes parts [0, first[1]), bin j parts [first[j],
        # first[j + 1]) and the last bin parts [first[bins - 1], parts).
        first = _count_below(padded, boundaries)
        first[0] = 0
        first[bins] = parts
        weights = (histogram / rate).unsqueeze(1).expand(-1, rate).reshape(-1)  # torch's repeat_interleave / rate
        return segment_sum(weights, first)


_WINDOW = 8


def _mid_points_buffer(parts: int) -> torch.Tensor:
    """A reusable float32 buffer of ``parts + 2`` elements (per thread) starting with -inf."""
    cache: dict[int, torch.Tensor] = _SCRATCH.__dict__.setdefault("mid_points", {})
    buffer = cache.get(parts)
    if buffer is None:
        buffer = cache[parts] = torch.empty(parts + 2, dtype=torch.float32)
    buffer[0] = -math.inf
    return buffer


def _count_below(padded: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """``torch.searchsorted(padded[1:-1], queries)``: for each query, how many of the sorted
    values ``padded[1:-1]`` are below it (``padded`` holds them between -inf and +inf).

    The values are nearly evenly spaced mid-points, so each count is first estimated
    arithmetically, then made exact by comparing the query with a window of 8 values
    around the estimate: when the window holds both a value below the query and one not
    below it, the sorted order fixes the count exactly. A binary search over all the values
    per query (``searchsorted``) mispredicts a branch at nearly every one of its 15 steps on
    fresh data; three steps in a window cost a fraction. When an estimate misses its window
    (values far from evenly spaced), ``searchsorted`` over all the values."""
    n = len(padded) - 2
    first, last = padded[1].item(), padded[n].item()
    spacing = (last - first) / (n - 1) if n > 1 else 0.0
    if not (math.isfinite(spacing) and spacing > 0 and math.isfinite(_f32(1.0 / spacing))):
        # no spacing to estimate from, or one whose inverse overflows float32 (a range of
        # subnormal width): searchsorted over all the values
        return torch.searchsorted(padded[1 : n + 1], queries, side="left")
    # window start (in padded positions) a few values before the estimated crossing; a
    # float32 estimate is close enough (the window, not the estimate, decides the count)
    start = torch.sub(queries, first + (_WINDOW // 2 - 1) * spacing).mul_(1.0 / spacing)
    start = start.clamp_(0, n + 2 - _WINDOW).to(torch.int64)  # non-negative: truncation floors
    windows = padded.unfold(0, _WINDOW, 1).index_select(0, start)  # row j: padded[start[j] : start[j] + 8]
    below = torch.searchsorted(windows, queries.unsqueeze(1), side="left").squeeze(1)
    low, high = torch.aminmax(below)
    if low.item() < 1 or high.item() >= _WINDOW:  # a crossing outside its window
        return torch.searchsorted(padded[1 : n + 1], queries, side="left")
    # padded[start + below - 1] < query <= padded[start + below]: below the query are the
    # padded values before start + below, i.e. start + below - 1 of the real ones
    return start.add_(below).sub_(1)


#: Another name for :class:`HistogramObserver` (quantweave 0.1's opt-in faster class, now the
#: default): the same class, kept so code that names it keeps working.
FastHistogramObserver = HistogramObserver


def _float32_cpu_state(min_val: torch.Tensor, max_val: torch.Tensor, histogram: torch.Tensor, bins: int) -> bool:
    """The observer's state is what the fast path writes: float32 on CPU, one-element
    min/max, ``bins`` counts."""
    return (
        min_val.dtype == torch.float32
        and max_val.dtype == torch.float32
        and histogram.dtype == torch.float32
        and min_val.is_cpu
        and max_val.is_cpu
        and histogram.is_cpu
        and min_val.numel() == 1
        and max_val.numel() == 1
        and histogram.shape == (bins,)
    )


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
    return x.dtype == torch.float32 and x.is_cpu and x.numel() < 2**24


def exact_histc(x: torch.Tensor, bins: int, lo: float, hi: float, *, within: bool = False) -> torch.Tensor:
    """``torch.histc(x, bins, min=lo, max=hi)`` -- the same float32 counts -- computed with
    vectorised tensor ops and ``bincount``, about 5x faster on CPU.

    torch's CPU kernel (histc's linear-interpolation path) puts an element ``e`` of
    ``[L, R]`` (the float32 edges; ``lo == hi`` widens them by 1 each side) into bin
    ``int(((e - L) * bins) / (R - L))`` in float32 arithmetic, the last bin keeping ``R``;
    this computes the same expression elementwise. ``within=True``: the caller knows every
    element is in ``[lo, hi]`` (skips a check). Falls back to ``torch.histc`` where that
    identity is not guaranteed: not float32 on CPU, 2**24 elements or more, a range that is
    not finite and positive in float32, or elements outside it."""
    if not _exact_histc_applies(x):
        return torch.histc(x, bins, min=lo, max=hi)
    flat = x.reshape(-1)
    if not within and len(flat):
        low, high = torch.aminmax(flat)
        left, right = _histc_edges(lo, hi)
        if not (low.item() >= left and high.item() <= right):  # the kernel skips elements outside
            return torch.histc(x, bins, min=lo, max=hi)
    counts = _histc_counts(flat, bins, lo, hi)
    if counts is None:
        return torch.histc(x, bins, min=lo, max=hi)
    return counts.to(torch.float32)


def _histc_edges(lo: float, hi: float) -> tuple[float, float]:
    """The float32 edges torch.histc's kernel uses (``lo == hi`` widened by 1 each side)."""
    if lo == hi:
        lo, hi = lo - 1.0, hi + 1.0
    return _f32(lo), _f32(hi)


def _histc_counts(flat: torch.Tensor, bins: int, lo: float, hi: float) -> torch.Tensor:
    """The int64 counts of ``torch.histc(flat, bins, min=lo, max=hi)`` for a flat float32
    CPU tensor of fewer than 2**24 elements, all in ``[lo, hi]`` (the caller's guarantee).
    Falls back to ``torch.histc`` (float32 counts) for a range that is not finite and
    positive in float32, where the arithmetic below is not the kernel's."""
    n = len(flat)
    plan = _histc_plan(lo, hi, bins)
    if plan is None or n == 0:
        return torch.histc(flat, bins, min=lo, max=hi)
    left, divisor, multiply = plan
    scaled, position = _scratch(n, torch.int16 if bins < 2**15 - 1 else torch.int32)
    torch.sub(flat, left, out=scaled)  # left is a float32 value: the scalar converts exactly
    if multiply:
        scaled.mul_(bins)
    scaled.div_(divisor)
    position.copy_(scaled)  # float -> integer truncates, as the kernel's cast does (values in [0, bins])
    position.clamp_(max=bins - 1)  # the last bin keeps the right edge
    return torch.bincount(position, minlength=bins)


@functools.lru_cache(maxsize=256)
def _histc_plan(lo: float, hi: float, bins: int) -> tuple[float, float, bool] | None:
    """(left edge, divisor, whether to multiply by ``bins`` first) of torch.histc's
    arithmetic for this range, or None where it does not apply (a range that is not finite
    and positive in float32). Cached: an observer counts batch after batch on one range."""
    left, right = _histc_edges(lo, hi)
    # the kernel's float32 edges and width (double rounding of float32 operands is exact)
    width = _f32(right - left)
    if not (math.isfinite(left) and math.isfinite(width) and width > 0):
        return None
    step = _f32(width / bins)
    if bins & (bins - 1) == 0 and step * bins == width and math.isfinite(_f32(width * bins)):
        # bins a power of two, width / bins exact, (e - L) * bins never overflowing: the
        # kernel's ((e - L) * bins) / width multiplies exactly, so it equals (e - L) / step
        return left, step, False
    return left, width, True


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
    cache: dict[torch.dtype, tuple[int, torch.Tensor, torch.Tensor]] = _SCRATCH.__dict__.setdefault("buffers", {})
    buffers = cache.get(index_dtype)
    if buffers is None or buffers[0] < n:
        buffers = (n, torch.empty(n, dtype=torch.float32), torch.empty(n, dtype=index_dtype))
        cache[index_dtype] = buffers
    return buffers[1][:n], buffers[2][:n]


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
        # reduced in the input's own dtype, then the (per-channel) results converted: a bf16
        # weight is never copied whole to float32 (rounding is monotonic, so converting the
        # minimum gives the minimum of the converted values)
        y = torch.flatten(x.permute(axes), start_dim=1)
        low, high = torch.amin(y, dim=1).to(min_val.dtype), torch.amax(y, dim=1).to(max_val.dtype)
        if min_val.numel() == 0 or max_val.numel() == 0:
            min_val, max_val = low, high
        else:
            min_val = torch.min(low, min_val)
            max_val = torch.max(high, max_val)
        self.min_val.resize_(min_val.shape)
        self.max_val.resize_(max_val.shape)
        self.min_val.copy_(min_val)
        self.max_val.copy_(max_val)
        _remember(self, x_orig)
        return x_orig


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


def is_fake_quant_module(module: object) -> bool:
    """True for fake-quantize modules: torch's, and by protocol any module with an
    ``activation_post_process``, ``fake_quant_enabled`` / ``observer_enabled`` flags and
    the observer protocol (:func:`is_observer_module`), such as torchao's."""
    if isinstance(module, FakeQuantizeBase):
        return True
    return (
        isinstance(module, torch.nn.Module)
        and isinstance(getattr(module, "activation_post_process", None), torch.nn.Module)
        and hasattr(module, "fake_quant_enabled")
        and hasattr(module, "observer_enabled")
        and _observer_protocol(module)
    )


def _observer_protocol(module: object) -> bool:
    return (
        isinstance(module, torch.nn.Module)
        and callable(getattr(module, "calculate_qparams", None))
        and hasattr(module, "dtype")
        and not callable(getattr(module, "convert", None))  # converts itself (torchao's affine observers)
    )


def is_observer_module(module: object) -> bool:
    """True for observer and fake-quantize modules that convert turns into q/dq ops.

    torch's classes (``torch.ao.quantization``) and, by protocol, any module with a
    ``calculate_qparams()`` method and a ``dtype`` (with the optional ``qscheme``,
    ``quant_min`` / ``quant_max``, ``ch_axis``, ``is_dynamic`` and, for fake-quantizers,
    ``activation_post_process``), such as torchao's observers and fake-quantizers.
    Modules that convert themselves (a ``convert()`` method, as torchao's affine observers
    have) are not: convert calls their own method instead (see ``_modules.convert_rules``)."""
    if isinstance(module, (ObserverBase, FakeQuantizeBase)):
        return True
    return _observer_protocol(module)


def is_calibrated(module: torch.nn.Module) -> bool:
    """False when an observer that learns from data has seen none.

    Fixed, placeholder (dynamic) and derived observers need no data of their own.
    """
    if is_fake_quant_module(module):
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
    return all_finite_pair(min_val, max_val, _all_finite)


def _all_finite(values: torch.Tensor) -> bool:
    """``torch.isfinite(values).all()`` as one min/max reduction (NaN anywhere makes both NaN):
    an LLM's per-group observers hold 10^5-10^6 values, and ``isfinite(...).all()`` is ~15x
    slower on CPU."""
    if values.is_complex() or not values.is_floating_point():
        return bool(torch.isfinite(values).all())
    low, high = torch.aminmax(values.detach().reshape(-1))
    return bool(low > float("-inf")) and bool(high < float("inf"))

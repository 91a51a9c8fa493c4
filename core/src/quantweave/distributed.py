"""Calibrate on several processes: synchronize observers over a ``torch.distributed`` group.

Every rank prepares the same model with the same quantizer, calibrates it on its own shard
of the data, then calls :func:`sync_observers`; afterwards every rank's observers hold the
merged state and any rank can ``convert_pt2e``. Launch with ``torchrun``; without an
initialized process group the calls act on one process (so the same script runs under plain
``python``). What each observer kind does (see ``docs/distributed.md``):

- ``MinMaxObserver`` / ``PerChannelMinMaxObserver``: all-reduce of the minimum of
  ``min_val`` and of the maximum of ``max_val`` -- **exactly** the state one process reaches
  on the union of the shards, whatever the order.
- ``HistogramObserver`` (quantweave's, the default, and torch's): the global range is agreed
  first (all-reduce), each rank maps its histogram onto it the way the observer itself
  re-bins when its range grows, and the histograms are summed (all-reduce). When every rank
  already has the global range -- after :func:`range_pass` -- nothing is re-binned and the
  result is **exactly** that of one process running the same two passes on the union.
  Otherwise it is within the bound stated in ``docs/distributed.md`` (one process is itself
  order-dependent by as much).
- ``MovingAverageMinMaxObserver`` / ``MovingAveragePerChannelMinMaxObserver``: the mean of
  the states of the ranks that saw data. Not what one process would compute (its state
  depends on the batch order); documented, not exact.
- Fake-quantizers (QAT): their inner observer is merged by its kind and their ``scale`` /
  ``zero_point`` recomputed from it (when their observer is enabled).
- Fixed, placeholder (dynamic) and derived observers need no data: nothing to merge.

Ranks whose observers saw no data contribute nothing; observers that saw data on no rank
stay uncalibrated (``convert_pt2e`` then names them). Before anything is merged, every rank
checks that all ranks have the same observers (names, classes, settings, shapes); a
mismatch, an observer type that cannot be merged, or a rank that fails, raises
:class:`~quantweave.errors.DistributedSyncError` on every rank, and no observer is changed.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx import GraphModule

from ._modules.collectives import LocalGroup, TorchGroup, group_for
from ._modules.graph import check_graph_module
from ._modules.observer_calls import observer_calls
from ._modules.torch_compat import HistogramObserver as TorchHistogramObserver
from ._modules.torch_compat import rebin_histogram
from .errors import DistributedSyncError
from .observers import (
    DerivedObserver,
    FakeQuantizeBase,
    FixedQParamsFakeQuantize,
    FixedQParamsObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)

__all__ = ["DistributedSyncError", "SyncSummary", "range_pass", "sync_observers"]

Group = Any  # a torch.distributed ProcessGroup, or None for the default group
Timeout = float | datetime.timedelta | None

MINMAX = "minmax"
PER_CHANNEL = "per_channel_minmax"
MOVING_AVERAGE = "moving_average_minmax"
MOVING_AVERAGE_PER_CHANNEL = "moving_average_per_channel_minmax"
HISTOGRAM = "histogram"
STATIC = "static"
UNSUPPORTED = "unsupported"

#: Observer classes whose state can be merged, most specific first. A subclass is merged as
#: the first class here it derives from, provided it keeps that class's ``forward`` (the
#: state update); one that overrides it may keep a different state and is refused.
#: quantweave's HistogramObserver has its own ``forward``, which keeps exactly the state of
#: torch's (``tests/core/test_observers.py``), so it is listed as a class of its own.
MERGEABLE: tuple[tuple[type[torch.nn.Module], str], ...] = (
    (MovingAveragePerChannelMinMaxObserver, MOVING_AVERAGE_PER_CHANNEL),
    (MovingAverageMinMaxObserver, MOVING_AVERAGE),
    (PerChannelMinMaxObserver, PER_CHANNEL),
    (MinMaxObserver, MINMAX),
    (HistogramObserver, HISTOGRAM),
    (TorchHistogramObserver, HISTOGRAM),
)
_MOVING = (MOVING_AVERAGE, MOVING_AVERAGE_PER_CHANNEL)
_INF = float("inf")


@dataclasses.dataclass(frozen=True)
class SyncSummary:
    """What :func:`sync_observers` did (identical on every rank).

    ``merged`` counts observers merged per kind (``minmax``, ``per_channel_minmax``,
    ``histogram``, ``moving_average_minmax``, ``moving_average_per_channel_minmax``; an
    observer inside a fake-quantizer counts under its own kind, and ``fake_quantizers``
    counts those); ``static`` the observers that need no data (fixed, placeholder/dynamic,
    derived); ``uncalibrated`` the observers no rank fed data (``convert_pt2e`` will name
    them); ``rebinned`` the histogram observers whose ranges differed across ranks (merged
    within the documented bound rather than exactly; empty after :func:`range_pass`);
    ``averaged`` the moving-average observers (merged by the documented mean, not equal to a
    one-process run). ``payload_bytes`` is what this rank contributed to the collectives
    (0 without a process group).
    """

    world_size: int
    merged: dict[str, int]
    static: int
    fake_quantizers: int
    uncalibrated: tuple[str, ...]
    rebinned: tuple[str, ...]
    averaged: tuple[str, ...]
    payload_bytes: int
    seconds: float

    @property
    def exact(self) -> bool:
        """True when every merged observer holds exactly the state one process would reach
        on the union of the shards (no histogram re-binned, no moving average)."""
        return not self.rebinned and not self.averaged


# -- the observers of a prepared model ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One observer as a rank describes it to the others."""

    name: str
    sources: tuple[str, ...]
    cls: str
    kind: str
    config: tuple[Any, ...]
    shape: tuple[int, ...] | None  # shape of the state (None: no data on this rank)
    reason: str = ""  # why it cannot be merged (kind UNSUPPORTED)


def _qualname(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _observers(gm: GraphModule) -> dict[str, tuple[torch.nn.Module, tuple[str, ...]]]:
    """Observer submodules reached from the graph (name -> module, observed node names)."""
    found: dict[str, tuple[torch.nn.Module, list[str]]] = {}
    for node, module in observer_calls(gm):
        source = node.args[0] if node.args else None
        entry = found.setdefault(str(node.target), (module, []))
        entry[1].append(getattr(source, "name", str(source)))
    return {name: (module, tuple(sources)) for name, (module, sources) in found.items()}


def _inner(module: torch.nn.Module) -> Any:
    """The module holding the state: a fake-quantizer's observer, else the module itself
    (typed Any: its buffers and settings are read by name)."""
    if isinstance(module, FakeQuantizeBase) and not isinstance(module, FixedQParamsFakeQuantize):
        inner = getattr(module, "activation_post_process", None)
        if isinstance(inner, torch.nn.Module):
            return inner
    return module


def _classify(module: torch.nn.Module) -> tuple[str, str]:
    """(kind, reason it cannot be merged)."""
    if isinstance(module, (FixedQParamsObserver, PlaceholderObserver, DerivedObserver, FixedQParamsFakeQuantize)):
        return STATIC, ""
    if getattr(module, "is_dynamic", False):
        return STATIC, ""  # qparams are chosen at run time
    if isinstance(module, FakeQuantizeBase):
        inner = _inner(module)
        if inner is module:
            return UNSUPPORTED, "a fake-quantizer without an activation_post_process observer"
        kind, reason = _classify(inner)
        if kind == UNSUPPORTED:
            return kind, f"its observer {_qualname(inner)} cannot be merged: {reason}"
        return kind, ""
    for cls, kind in MERGEABLE:
        if isinstance(module, cls):
            if type(module).forward is not cls.forward:
                return UNSUPPORTED, (
                    f"it subclasses {_class_name(cls)} but overrides forward, so its state may not "
                    f"mean what {_class_name(cls)}'s does"
                )
            return kind, ""
    names = ", ".join(_class_name(cls) for cls, _ in MERGEABLE)
    return UNSUPPORTED, f"quantweave.distributed merges {names} and their subclasses that keep forward"


def _class_name(cls: type) -> str:
    """``torch.ao.quantization.observer.HistogramObserver``, ``quantweave.observers.HistogramObserver``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _config(module: torch.nn.Module) -> tuple[Any, ...]:
    state = _inner(module)
    names = ("dtype", "qscheme", "quant_min", "quant_max", "ch_axis", "bins", "averaging_constant", "is_dynamic")
    return tuple((name, repr(getattr(state, name, None))) for name in names)


def _state_shape(module: torch.nn.Module, kind: str) -> tuple[int, ...] | None:
    """Shape of the observed state, None when this rank fed the observer no data."""
    state = _inner(module)
    min_val, max_val = state.min_val, state.max_val
    if not isinstance(min_val, torch.Tensor) or not isinstance(max_val, torch.Tensor):
        raise TypeError(f"{_qualname(state)} has no min_val/max_val tensors")
    if min_val.shape != max_val.shape:
        raise ValueError(f"min_val {tuple(min_val.shape)} and max_val {tuple(max_val.shape)} differ in shape")
    if kind == HISTOGRAM:
        bins = int(state.bins)
        if tuple(state.histogram.shape) != (bins,):
            raise ValueError(f"its histogram has shape {tuple(state.histogram.shape)}, not ({bins},)")
        if min_val.numel() != 1:
            raise ValueError(f"its min_val has {min_val.numel()} elements, not 1")
    if min_val.numel() == 0 or not bool((min_val <= max_val).all()):
        return None  # empty (per-channel) or (inf, -inf): no data
    return tuple(min_val.shape)


def _local_entries(gm: GraphModule) -> list[_Entry]:
    entries = []
    for name, (module, sources) in _observers(gm).items():
        kind, reason = _classify(module)
        shape = None
        if kind not in (STATIC, UNSUPPORTED):
            try:
                shape = _state_shape(module, kind)
            except (TypeError, ValueError, AttributeError) as error:
                raise ValueError(f"observer {name} (observes {', '.join(map(repr, sources))}): {error}") from error
        entries.append(_Entry(name, sources, _qualname(module), kind, _config(module), shape, reason))
    return entries


# -- agreeing on the inventory -------------------------------------------------------------------


def _describe(entry: _Entry) -> str:
    return f"{entry.name} (observes {', '.join(map(repr, entry.sources))})"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _agree(api: str, gathered: list[tuple[str | None, list[_Entry]]]) -> list[_Entry]:
    """Every rank runs this on the same gathered list, so all raise or none does.

    Returns rank 0's entries (graph order), each with the shape agreed among the ranks that
    saw data (None when none did).
    """
    failures = [(rank, error) for rank, (error, _) in enumerate(gathered) if error is not None]
    if failures:
        listing = "; ".join(f"rank {rank}: {error}" for rank, error in failures)
        raise DistributedSyncError(f"{api}: {len(failures)} rank(s) failed before synchronizing: {listing}")
    inventories = [{e.name: e for e in entries} for _, entries in gathered]
    problems: list[str] = []
    names = list(inventories[0]) + sorted({n for inv in inventories[1:] for n in inv} - set(inventories[0]))
    agreed: list[_Entry] = []
    for name in names:
        present = [rank for rank, inv in enumerate(inventories) if name in inv]
        if len(present) != len(inventories):
            missing = [rank for rank in range(len(inventories)) if rank not in present]
            entry = inventories[present[0]][name]
            problems.append(f"{_describe(entry)} exists on {_ranks(present)} but not on {_ranks(missing)}")
            continue
        entries = [inv[name] for inv in inventories]
        variants: dict[tuple[Any, ...], list[int]] = {}
        for rank, entry in enumerate(entries):
            variants.setdefault((entry.cls, entry.kind, entry.config), []).append(rank)
        if len(variants) > 1:
            configs = [dict(config) for _, _, config in variants]
            differing = [key for key in configs[0] if len({c[key] for c in configs}) > 1]
            listing = "; ".join(
                f"{cls}{_settings(dict(config), differing)} on {_ranks(ranks)}"
                for (cls, _, config), ranks in variants.items()
            )
            problems.append(f"{_describe(entries[0])} differs between ranks: {listing}")
            continue
        shapes: dict[tuple[int, ...], list[int]] = {}
        for rank, entry in enumerate(entries):
            if entry.shape is not None:
                shapes.setdefault(entry.shape, []).append(rank)
        if len(shapes) > 1:
            listing = "; ".join(f"{list(shape)} on {_ranks(ranks)}" for shape, ranks in shapes.items())
            problems.append(f"{_describe(entries[0])} has a state of different shapes: {listing}")
            continue
        agreed.append(dataclasses.replace(entries[0], shape=next(iter(shapes), None)))
    if problems:
        raise DistributedSyncError(
            f"{api}: the ranks' prepared models differ ({len(problems)} observer(s)): "
            + "; ".join(problems[:20])
            + ("; ..." if len(problems) > 20 else "")
            + ". Every rank must prepare the same model with the same quantizer."
        )
    unsupported: dict[tuple[str, str], list[_Entry]] = {}
    for entry in agreed:
        if entry.kind == UNSUPPORTED:
            unsupported.setdefault((entry.cls, entry.reason), []).append(entry)
    if unsupported:
        listing = "; ".join(
            f"type {cls} ({', '.join(_describe(e) for e in entries)}): {reason}"
            for (cls, reason), entries in unsupported.items()
        )
        count = sum(len(entries) for entries in unsupported.values())
        raise DistributedSyncError(f"{api}: cannot synchronize {count} observer(s) of unsupported type: {listing}")
    return agreed


def _settings(config: dict[str, str], keys: list[str]) -> str:
    shown = [f"{key}={config[key]}" for key in keys if config[key] != "None"]
    return f" ({', '.join(shown)})" if shown else ""


def _exchange(
    api: str, comm: LocalGroup | TorchGroup, gm: GraphModule, build: Callable[[], list[_Entry]]
) -> tuple[list[_Entry], int]:
    """Join, then all-gather every rank's inventory (or its error) and agree on it."""
    error: str | None = None
    entries: list[_Entry] = []
    try:
        entries = build()
    except Exception as exc:  # reported to every rank, then raised everywhere
        error = f"{type(exc).__name__}: {exc}"
    comm.join(api)
    gathered = comm.gather_objects((error, entries), api, "inventory")
    return _agree(api, gathered), len(pickle.dumps(entries))


# -- the merge ------------------------------------------------------------------------------------


def _width(entry: _Entry) -> int:
    """Numbers per min (or max) vector of an observer's state."""
    if entry.shape is None:
        return 0
    n = 1
    for d in entry.shape:
        n *= d
    return n


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).to(device="cpu", dtype=torch.float64)


def _min_payload(entries: list[_Entry], modules: dict[str, torch.nn.Module]) -> torch.Tensor:
    """[min, -max] of every min/max and histogram observer (inf where no data here)."""
    parts: list[torch.Tensor] = []
    for entry in entries:
        if entry.shape is None or not _merger(entry).exact:
            continue
        state = _inner(modules[entry.name])
        n = _width(entry)
        if _state_shape(modules[entry.name], entry.kind) is None:
            parts += [torch.full((n,), _INF, dtype=torch.float64)] * 2
        else:
            parts += [_flat(state.min_val), -_flat(state.max_val)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _global_ranges(entries: list[_Entry], reduced: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    ranges: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    offset = 0
    for entry in entries:
        if entry.shape is None or not _merger(entry).exact:
            continue
        n = _width(entry)
        lo = reduced[offset : offset + n].reshape(entry.shape)
        hi = -reduced[offset + n : offset + 2 * n].reshape(entry.shape)
        ranges[entry.name] = (lo, hi)
        offset += 2 * n
    return ranges


def _sum_payload(
    comm: LocalGroup | TorchGroup,
    entries: list[_Entry],
    modules: dict[str, torch.nn.Module],
    ranges: dict[str, tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, Exception | None]:
    """[failed flag per rank] + per moving average [min, max, 1] (zeros without data) + per
    histogram [histogram on the global range, 1 if re-binned]; and this rank's error, if
    preparing them failed (then it sends zeros and its flag, so no rank waits)."""
    flags = torch.zeros(comm.world_size, dtype=torch.float64)
    parts: list[torch.Tensor] = []
    try:
        for entry in entries:
            if entry.shape is None or not _merger(entry).sum_width(entry):
                continue
            module = modules[entry.name]
            has_data = _state_shape(module, entry.kind) is not None
            parts += _merger(entry).sum_part(entry, _inner(module), has_data, ranges.get(entry.name))
    except Exception as error:  # tell the other ranks instead of leaving them waiting
        flags[comm.rank] = 1.0
        total = sum(_sum_width(e) for e in entries)
        return torch.cat([flags, torch.zeros(total, dtype=torch.float64)]), error
    return torch.cat([flags, *parts]), None


def _sum_width(entry: _Entry) -> int:
    return 0 if entry.shape is None else _merger(entry).sum_width(entry)


@dataclasses.dataclass
class _NewState:
    """Everything one observer will be given, computed before anything is written."""

    module: Any  # the observer or fake-quantizer in the model
    min_val: torch.Tensor
    max_val: torch.Tensor
    histogram: torch.Tensor | None = None
    qparams: tuple[torch.Tensor, torch.Tensor] | None = None  # a fake-quantizer's refreshed scale, zero point


def _write(state: torch.nn.Module, new: _NewState) -> None:
    for attr in ("min_val", "max_val", "histogram"):
        value = getattr(new, attr)
        if value is None:
            continue
        buffer = getattr(state, attr)
        buffer.resize_(value.shape)
        buffer.copy_(value)


# -- merging, one strategy per observer kind -----------------------------------------------------


_Range = tuple[torch.Tensor, torch.Tensor]  # the global (min, max) of one observer


class _Merger:
    """How observers of one kind merge across ranks. ``exact`` kinds take part in the
    all-reduce min of [min, -max]; a kind sends ``sum_width`` numbers to the all-reduce sum
    (``sum_part``: its numbers, zeros without data here) and builds its new state from the
    global range and its summed chunk (``merged``; the note says what was done to it)."""

    exact = True

    def sum_width(self, entry: _Entry) -> int:
        return 0

    def sum_part(self, entry: _Entry, state: Any, has_data: bool, global_range: _Range | None) -> list[torch.Tensor]:
        return []

    def merged(
        self, entry: _Entry, module: torch.nn.Module, global_range: _Range | None, chunk: torch.Tensor
    ) -> tuple[_NewState, str | None]:
        raise NotImplementedError


class _MinMaxMerger(_Merger):
    """Min/max (per tensor or per channel): the global min and max, exactly."""

    def merged(
        self, entry: _Entry, module: torch.nn.Module, global_range: _Range | None, chunk: torch.Tensor
    ) -> tuple[_NewState, str | None]:
        state = _inner(module)
        assert global_range is not None
        lo, hi = global_range
        return _NewState(module, lo.to(state.min_val.dtype), hi.to(state.max_val.dtype)), None


class _MovingAverageMerger(_Merger):
    """Moving averages: the mean over the ranks that saw data of their min and max."""

    exact = False

    def sum_width(self, entry: _Entry) -> int:
        return 2 * _width(entry) + 1

    def sum_part(self, entry: _Entry, state: Any, has_data: bool, global_range: _Range | None) -> list[torch.Tensor]:
        if not has_data:
            return [torch.zeros(self.sum_width(entry), dtype=torch.float64)]
        return [_flat(state.min_val), _flat(state.max_val), torch.ones(1, dtype=torch.float64)]

    def merged(
        self, entry: _Entry, module: torch.nn.Module, global_range: _Range | None, chunk: torch.Tensor
    ) -> tuple[_NewState, str | None]:
        state = _inner(module)
        n = _width(entry)
        assert entry.shape is not None  # merged only where some rank saw data
        count = chunk[-1]
        lo = (chunk[:n] / count).reshape(entry.shape)
        hi = (chunk[n : 2 * n] / count).reshape(entry.shape)
        return _NewState(module, lo.to(state.min_val.dtype), hi.to(state.max_val.dtype)), "averaged"


class _HistogramMerger(_Merger):
    """Histograms: each rank's histogram re-binned onto the global range, then summed."""

    def sum_width(self, entry: _Entry) -> int:
        return int(dict(entry.config)["bins"]) + 1

    def sum_part(self, entry: _Entry, state: Any, has_data: bool, global_range: _Range | None) -> list[torch.Tensor]:
        bins = int(state.bins)
        if not has_data:
            return [torch.zeros(bins + 1, dtype=torch.float64)]
        assert global_range is not None
        lo, hi = global_range
        histogram = state.histogram.detach()
        same = bool(state.min_val == lo.to(state.min_val.dtype)) and bool(state.max_val == hi.to(state.max_val.dtype))
        if not same:
            new_lo = lo.to(dtype=state.min_val.dtype, device=state.min_val.device).reshape(state.min_val.shape)
            new_hi = hi.to(dtype=state.max_val.dtype, device=state.max_val.device).reshape(state.max_val.shape)
            histogram = rebin_histogram(state, histogram, state.min_val, state.max_val, new_lo, new_hi)
        return [_flat(histogram), torch.tensor([0.0 if same else 1.0], dtype=torch.float64)]

    def merged(
        self, entry: _Entry, module: torch.nn.Module, global_range: _Range | None, chunk: torch.Tensor
    ) -> tuple[_NewState, str | None]:
        state = _inner(module)
        bins = int(state.bins)
        assert global_range is not None
        lo, hi = global_range
        new = _NewState(
            module,
            lo.to(state.min_val.dtype).reshape(state.min_val.shape),
            hi.to(state.max_val.dtype).reshape(state.max_val.shape),
            chunk[:bins].to(state.histogram.dtype),
        )
        return new, "rebinned" if chunk[bins] > 0 else None


#: observer kind -> how it merges (STATIC and UNSUPPORTED observers are never merged)
MERGERS: dict[str, _Merger] = {
    MINMAX: _MinMaxMerger(),
    PER_CHANNEL: _MinMaxMerger(),
    MOVING_AVERAGE: _MovingAverageMerger(),
    MOVING_AVERAGE_PER_CHANNEL: _MovingAverageMerger(),
    HISTOGRAM: _HistogramMerger(),
}


def _merger(entry: _Entry) -> _Merger:
    return MERGERS[entry.kind]


def _merge(
    comm: LocalGroup | TorchGroup,
    api: str,
    entries: list[_Entry],
    modules: dict[str, torch.nn.Module],
) -> tuple[dict[str, _NewState], list[str], list[str], int]:
    """Run the two all-reduces; return the new states, re-binned and averaged names, bytes."""
    minimum = _min_payload(entries, modules)
    reduced_min = comm.reduce(minimum, "min", api, "all-reduce min/max")
    ranges = _global_ranges(entries, reduced_min)
    summed, error = _sum_payload(comm, entries, modules, ranges)
    reduced_sum = comm.reduce(summed, "sum", api, "all-reduce histograms/moving averages")
    failed = [rank for rank in range(comm.world_size) if reduced_sum[rank] > 0]
    if failed:
        here = f" (here: {type(error).__name__}: {error})" if error is not None else " (see the error there)"
        raise DistributedSyncError(
            f"{api}: {_ranks(failed)} failed while preparing their histograms / moving averages{here}; "
            "observers were left as they were"
        ) from error
    new: dict[str, _NewState] = {}
    rebinned: list[str] = []
    averaged: list[str] = []
    offset = comm.world_size
    notes: dict[str, list[str]] = {"averaged": averaged, "rebinned": rebinned}
    for entry in entries:
        if entry.kind == STATIC or entry.shape is None:
            continue
        merger = _merger(entry)
        width = merger.sum_width(entry)
        chunk = reduced_sum[offset : offset + width]
        offset += width
        new[entry.name], note = merger.merged(entry, modules[entry.name], ranges.get(entry.name), chunk)
        if note:
            notes[note].append(entry.name)
    for state_new in new.values():
        if state_new.module is not _inner(state_new.module) and bool(state_new.module.observer_enabled[0]):
            # a fake-quantizer refreshes scale / zero point from its observer, as its forward does
            probe = copy.deepcopy(_inner(state_new.module))
            _write(probe, state_new)
            state_new.qparams = probe.calculate_qparams()
    return new, rebinned, averaged, 8 * (minimum.numel() + summed.numel())


def sync_observers(prepared: GraphModule, group: Group = None, timeout: Timeout = None) -> SyncSummary:
    """Merge the observers of ``prepared`` across the ranks of ``group``; call on every rank.

    Each rank calibrated its own copy of the same prepared model (same model, same
    quantizer) on its shard. Afterwards every rank holds the merged observers, so any rank
    can ``convert_pt2e``. ``group`` defaults to the default process group; without one
    (not launched with ``torchrun``) this is a one-process merge that changes nothing.
    ``timeout`` (seconds or a timedelta) bounds every wait, the first of which waits for the
    slowest rank to finish calibrating; None uses the process group's timeout.

    Raises :class:`~quantweave.errors.DistributedSyncError` on every rank -- with no observer
    changed -- when a rank fails or does not arrive in time, when the ranks' observers
    differ (names, classes, settings or shapes; the message names them and the ranks), or
    when an observer type cannot be merged (named). Returns a :class:`SyncSummary`.
    """
    api = "quantweave.distributed.sync_observers"
    start = time.perf_counter()
    gm = check_graph_module(prepared, api)
    comm = group_for(group, timeout)
    entries, inventory_bytes = _exchange(api, comm, gm, lambda: _local_entries(gm))
    modules = {name: module for name, (module, _) in _observers(gm).items()}
    new, rebinned, averaged, payload = _merge(comm, api, entries, modules)
    # everything is computed: write (local tensor copies only)
    for state_new in new.values():
        _write(_inner(state_new.module), state_new)
        if state_new.qparams is not None:
            scale, zero_point = state_new.qparams
            for attr, value in (("scale", scale), ("zero_point", zero_point)):
                buffer = getattr(state_new.module, attr)
                buffer.resize_(value.shape)
                buffer.copy_(value)
    merged: dict[str, int] = {}
    for entry in entries:
        if entry.name in new:
            merged[entry.kind] = merged.get(entry.kind, 0) + 1
    return SyncSummary(
        world_size=comm.world_size,
        merged=merged,
        static=sum(1 for e in entries if e.kind == STATIC),
        fake_quantizers=sum(1 for s in new.values() if s.module is not _inner(s.module)),
        uncalibrated=tuple(e.name for e in entries if e.kind != STATIC and e.shape is None),
        rebinned=tuple(rebinned),
        averaged=tuple(averaged),
        payload_bytes=payload + inventory_bytes if comm.world_size > 1 else 0,
        seconds=time.perf_counter() - start,
    )


# -- range_pass: make Histogram observers exact ----------------------------------------------------


class _RangeRecorder:
    """Stands in for a HistogramObserver's forward during :func:`range_pass`: records the
    range the observer would reach (finite values only, as it does), not a histogram."""

    def __init__(self) -> None:
        self.min_val = torch.tensor(_INF)
        self.max_val = torch.tensor(-_INF)
        self.non_finite_batches = 0  # read by quantweave.calibrate, as the observer's

    def snapshot_state(self) -> tuple[Any, ...]:
        """For ``quantweave.calibrate``'s rollback of a failed batch (the tensors are
        replaced, never written in place: keeping them keeps the state)."""
        return self.min_val, self.max_val, self.non_finite_batches

    def restore_state(self, state: tuple[Any, ...]) -> None:
        self.min_val, self.max_val, self.non_finite_batches = state

    def __call__(self, x_orig: torch.Tensor) -> torch.Tensor:
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach()
        x_min, x_max = torch.aminmax(x)
        if not bool(torch.isfinite(x_min) & torch.isfinite(x_max)):
            self.non_finite_batches += 1
        if x_min == -_INF or x_max == _INF:  # the observer ignores infinities
            x = x[x.abs() != _INF]
            if x.numel() == 0:
                return x_orig
            x_min, x_max = torch.aminmax(x)
        self.min_val = torch.min(self.min_val, x_min.to(self.min_val.dtype))
        self.max_val = torch.max(self.max_val, x_max.to(self.max_val.dtype))
        return x_orig


def _passthrough(x: torch.Tensor) -> torch.Tensor:
    return x


@contextlib.contextmanager
def range_pass(prepared: GraphModule, group: Group = None, timeout: Timeout = None) -> Iterator[None]:
    """A first calibration pass that makes the Histogram merge exact (call on every rank).

    Inside the ``with`` block, run the shard through ``prepared`` once: Histogram observers
    only record their range, moving-average observers are paused (so they see each batch
    once, in the second pass) and min/max observers observe as usual. On leaving the block
    the ranks agree on each Histogram observer's global range (one all-reduce) and every
    rank starts its histograms on it. Then run the shard again and call
    :func:`sync_observers`: no histogram is re-binned, on any rank, so the merged qparams
    equal those of one process running the same two passes over the union of the shards.
    Costs a second pass over the data.

    Histogram observers must not have seen data yet. If the block raises, the observers
    are restored and the exception propagates (the other ranks then fail within
    ``timeout``). Errors as in :func:`sync_observers`.
    """
    api = "quantweave.distributed.range_pass"
    gm = check_graph_module(prepared, api)
    comm = group_for(group, timeout)
    found = _observers(gm)
    histograms: dict[str, Any] = {}
    paused: list[torch.nn.Module] = []
    for name, (module, sources) in found.items():
        kind, _ = _classify(module)
        if kind == HISTOGRAM and module is _inner(module):
            if _state_shape(module, kind) is not None:
                raise ValueError(
                    f"{api}: observer {name} (observes {', '.join(map(repr, sources))}) already saw data; "
                    "the range pass must come before calibration"
                )
            histograms[name] = module
        elif kind in _MOVING and module is _inner(module):
            paused.append(module)
    recorders = {name: _RangeRecorder() for name in histograms}
    # instance attributes shadow the class's forward (nn.Module.__call__ looks it up on the
    # instance); deleting them restores it
    for name, module in histograms.items():
        setattr(module, "forward", recorders[name])  # noqa: B010
    for module in paused:
        setattr(module, "forward", _passthrough)  # noqa: B010
    try:
        yield
    finally:
        for module in (*histograms.values(), *paused):
            delattr(module, "forward")
    # the block completed: agree on the ranges, then start every histogram on its range

    def build() -> list[_Entry]:
        entries = _local_entries(gm)
        return [
            dataclasses.replace(e, shape=() if bool(recorders[e.name].min_val <= recorders[e.name].max_val) else None)
            if e.name in recorders
            else e
            for e in entries
        ]

    entries, _ = _exchange(api, comm, gm, build)
    parts: list[torch.Tensor] = []
    seeded = [e for e in entries if e.name in recorders and e.shape is not None]
    for entry in seeded:
        recorder = recorders[entry.name]
        parts += [_flat(recorder.min_val), -_flat(recorder.max_val)]
    payload = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
    reduced = comm.reduce(payload, "min", api, "all-reduce ranges")
    for i, entry in enumerate(seeded):
        module = histograms[entry.name]
        lo, hi = reduced[2 * i], -reduced[2 * i + 1]
        module.min_val.resize_(())
        module.min_val.copy_(lo)
        module.max_val.resize_(())
        module.max_val.copy_(hi)
        module.histogram.resize_(int(module.bins))
        module.histogram.zero_()

"""The observers' state around one calibration batch: what to restore when it fails, and
whether it brought non-finite values.

:class:`ObserverStates` tracks every observer (and fake-quantize) module of a prepared model
and the modules inside them (a fake-quantizer's observer): each buffer and parameter, and
the plain Python attributes (``PerChannelMinMaxObserver._last_seen``, the counters of the
``HistogramObserver``...). Only observers are tracked, never the model's own weights.

It is cheap because it copies only what changed, in a few tensor ops. It keeps a copy of
every tensor as it was after the last good batch, with the tensor's version counter (which
every in-place op bumps) at the time; after each good batch it copies just the tensors whose
object or version changed (a histogram, a running min/max; not a weight observer that
skipped, nor an ``eps``): 0-d ones as Python numbers, the others packed into one flat buffer
per dtype (one ``cat``, and one reduction for the non-finite check below), whatever the
number of observers. Python attributes: for the observer classes whose ``forward`` is known,
only those it writes (none for torch's, ``_last_seen`` for quantweave's per-channel and
per-group ones, the non-finite counter for its histogram one); for any other class, a
shallow copy of its ``__dict__`` before every batch. On failure every
changed tensor is put back -- the same tensor object, resized and refilled from its copy --
and every attribute restored. The version counter is trusted only for the classes known to
bump it (torch's and quantweave's observers and fake-quantizers, except
``FusedMovingAvgObsFakeQuantize``, whose fused kernel does not): the tensors of any other
observer class are copied after every batch, whatever it does (``tensor.data`` writes
included).

Non-finite data: after a batch, the floating-point tensors that changed must be finite (a
NaN or an infinity reaching a min/max, moving-average, per-channel or fake-quantize
observer ends up in its state), and no ``HistogramObserver`` may have counted a batch with
non-finite values (torch's code drops infinities with a warning and fails on NaN).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import OrderedDict
from typing import Any

import torch

from . import torch_compat as tc
from .group_observer import PerGroupMinMaxObserver
from .torch_compat import FusedMovingAvgObsFakeQuantize

__all__ = ["NON_FINITE_ATTR", "ObserverStates"]

#: the counter (int) quantweave's HistogramObserver increments for every batch with NaN or
#: infinite values; an object in an observer's attributes may define ``snapshot_state()`` /
#: ``restore_state(state)`` (the range recorder of ``quantweave.distributed.range_pass``)
NON_FINITE_ATTR = "non_finite_batches"

_MODULE_INTERNALS = frozenset(("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "training"))


_MISSING = object()
#: attribute types that never carry a snapshot_state protocol (skipped cheaply)
_PLAIN = frozenset((bool, int, float, str, type(None), dict, OrderedDict, list, tuple, set, torch.dtype, torch.qscheme))

#: packed copies: (slots, flat buffer holding their tensors one after the other, or the
#: Python numbers of 0-d tensors)
Packed = list[tuple[list["_Slot"], "torch.Tensor | list[Any]"]]
_item = operator.methodcaller("item")


_get_version = operator.attrgetter("_version")


def _attributes_written(module: torch.nn.Module) -> tuple[str, ...] | None:
    """The plain attributes ``module``'s forward may write, for the classes whose forward is
    known (exact classes: torch's observers and fake-quantizers write none, quantweave's
    ``PerChannelMinMaxObserver`` and ``PerGroupMinMaxObserver`` their ``_last_seen``, its
    ``HistogramObserver`` its non-finite counter); None for any other class: its whole
    ``__dict__`` is copied."""
    from .. import observers as qo  # quantweave.observers imports this package's modules

    cls = type(module)
    if cls is qo.PerChannelMinMaxObserver or cls is PerGroupMinMaxObserver:
        return ("_last_seen",)
    if cls is qo.HistogramObserver:
        return (NON_FINITE_ATTR,)
    known = (
        tc.MinMaxObserver,
        tc.PerChannelMinMaxObserver,
        tc.MovingAverageMinMaxObserver,
        tc.MovingAveragePerChannelMinMaxObserver,
        tc.HistogramObserver,
        tc.FixedQParamsObserver,
        tc.PlaceholderObserver,
        tc.FakeQuantize,
        tc.FixedQParamsFakeQuantize,
        tc.FusedMovingAvgObsFakeQuantize,
        qo.DerivedObserver,
    )
    return () if cls in known else None


def _version_tracked(module: torch.nn.Module) -> bool:
    """Whether every write of ``module`` to its tensors bumps their version counters: true of
    torch's observer and fake-quantize classes (in-place ops) and quantweave's, except
    ``FusedMovingAvgObsFakeQuantize``, whose fused kernel writes its min/max, scale and zero
    point without bumping them. The tensors of any other class (a plugin's, a subclass
    defined elsewhere) are copied before every batch: safe whatever it does."""
    cls = type(module)
    if issubclass(cls, FusedMovingAvgObsFakeQuantize):
        return False
    return cls.__module__.startswith(("torch.ao.quantization.", "quantweave."))


def _version(t: torch.Tensor) -> int | None:
    try:
        return int(t._version)
    except (RuntimeError, AttributeError):  # inference tensors keep no version counter
        return None


class _Slot:
    """One tensor of an observer: where it lives (``container[key]`` of module ``owner``),
    the tensor object, its version counter, and where its copy is: ``numel`` elements at
    ``offset`` in the flat ``buffer``, of shape ``shape``."""

    __slots__ = (
        "buffer",
        "container",
        "index",
        "key",
        "numel",
        "offset",
        "owner",
        "shape",
        "tensor",
        "tracked",
        "version",
    )

    def __init__(self, owner: str, container: dict[str, Any], key: str, tracked: bool) -> None:
        self.index = -1  # position in ObserverStates.slots
        self.owner = owner
        self.tracked = tracked  # False: the version counter cannot be trusted, copy every time
        self.container = container
        self.key = key
        self.tensor: torch.Tensor | None = None
        self.version: int | None = None
        self.buffer: torch.Tensor | list[Any] | None = None
        self.offset = 0
        self.numel = 0
        self.shape = torch.Size()

    def restore(self) -> None:
        original = self.tensor
        current = self.container.get(self.key)
        if current is not original:
            if original is None:
                del self.container[self.key]
                return
            self.container[self.key] = original
        elif original is None or (self.version is not None and original._version == self.version):
            return
        assert self.buffer is not None
        with torch.no_grad():
            if original.shape != self.shape:
                original.resize_(self.shape)
            if isinstance(self.buffer, list):  # a 0-d tensor, kept as a Python number
                original.fill_(self.buffer[self.offset])
            else:
                original.copy_(self.buffer[self.offset : self.offset + self.numel].reshape(self.shape))
        self.version = _version(original)


def _pack(slots: list[_Slot]) -> Packed:
    """The slots' current tensors copied into a few flat buffers (one per dtype, device and
    rank class: 1-d tensors concatenated, others flattened; 0-d ones -- a min/max observer's
    state -- read as Python numbers, which ``item`` does faster than ``stack`` copies them):
    a handful of tensor ops whatever the number of observers."""
    groups: dict[tuple[Any, ...], list[tuple[_Slot, torch.Tensor]]] = {}
    for slot in slots:
        t = slot.container.get(slot.key)
        if t is None:
            continue
        rank = t.dim()
        key = (t.dtype, rank) if rank == 0 else (t.dtype, t.device, min(rank, 2))  # item() needs no device
        groups.setdefault(key, []).append((slot, t))
    packed: Packed = []
    with torch.no_grad():
        for key, items in groups.items():
            rank = key[-1]
            tensors = [t for _, t in items]
            buffer: torch.Tensor | list[Any]
            if rank == 0:
                buffer = list(map(_item, tensors))
            elif rank == 1:
                buffer = torch.cat(tensors) if len(tensors) > 1 else tensors[0].clone()
            else:
                buffer = torch.cat([t.reshape(-1) for t in tensors])
            packed.append(([slot for slot, _ in items], buffer))
    return packed


def _finite(buffer: torch.Tensor | list[Any]) -> bool:
    """Whether a packed buffer holds only finite values (one reduction for a tensor; a
    non-finite sum is either non-finite data or an overflow: then look closer)."""
    if isinstance(buffer, list):
        return all(map(math.isfinite, buffer)) if buffer and isinstance(buffer[0], float) else True
    if not buffer.is_floating_point():
        return True
    return math.isfinite(buffer.sum().item()) or bool(buffer.isfinite().all())


def _adopt(packed: Packed, tensors: list[Any], versions: list[Any]) -> None:
    """The packed copies become the state the slots restore (``tensors`` / ``versions``:
    the lookup lists of :meth:`ObserverStates.changed_slots`, by slot index)."""
    for slots, buffer in packed:
        offset = 0
        for slot in slots:
            t = slot.container[slot.key]
            n = t.numel()
            version = _version(t) if slot.tracked else None
            slot.tensor, slot.version = t, version
            slot.buffer, slot.offset, slot.numel, slot.shape = buffer, offset, n, t.shape
            offset += n
            if slot.index >= 0:
                tensors[slot.index], versions[slot.index] = t, version


class ObserverStates:
    """See the module docstring. ``observers``: name -> observer module."""

    def __init__(self, observers: dict[str, torch.nn.Module]) -> None:
        self.slots: list[_Slot] = []
        self.modules: list[tuple[str, torch.nn.Module]] = []
        histograms: list[tuple[str, Any]] = []
        self.objects: list[tuple[str, Any]] = []  # objects with snapshot_state / restore_state
        self.tracked: dict[int, bool] = {}
        seen: set[int] = set()
        for name, observer in observers.items():
            tracked = all(_version_tracked(m) for m in observer.modules())
            for sub_name, module in observer.named_modules(prefix=name):
                if id(module) in seen:
                    continue
                seen.add(id(module))
                self.modules.append((sub_name, module))
                self.tracked[id(module)] = tracked
                for container in (module._buffers, module._parameters):
                    for key in container:
                        self.slots.append(_Slot(sub_name, container, key, tracked))
                if hasattr(type(module), NON_FINITE_ATTR):
                    histograms.append((sub_name, module))
                # objects with a state of their own in the module's attributes (found once: a
                # range_pass is entered before calibrate, not during it)
                self.objects += [
                    (sub_name, obj)
                    for obj in module.__dict__.values()
                    if type(obj) not in _PLAIN
                    and hasattr(type(obj), "snapshot_state")
                    and hasattr(type(obj), "restore_state")
                ]
        self.counted = histograms + self.objects  # what counts batches with non-finite values
        self.tensors: list[Any] = []
        self.versions: list[Any] = []
        self._index()
        self.dicts = [m.__dict__ for _, m in self.modules]
        self.plans = [_attributes_written(m) for _, m in self.modules]
        _adopt(_pack(self.slots), self.tensors, self.versions)
        self.attributes: list[Any] = []
        self.states: list[Any] = []
        self.counts: list[int] = []

    # -- per batch ----------------------------------------------------------------------------

    def begin(self) -> None:
        """Before a batch: copy the Python attributes the observers may write (the
        tensors' copies are up to date)."""
        self.attributes = [
            d.copy() if plan is None else tuple(d.get(k, _MISSING) for k in plan) if plan else ()
            for d, plan in zip(self.dicts, self.plans, strict=True)
        ]
        self.states = [obj.snapshot_state() for _, obj in self.objects]
        self.counts = [getattr(m, NON_FINITE_ATTR, 0) for _, m in self.counted]

    def changed_slots(self) -> list[_Slot]:
        """The tensors replaced or written in place since the last good batch. This runs
        for every tracked tensor after every batch: the lookups and comparisons are
        ``map`` s over lists (an untracked slot's version is None: never equal)."""
        current = list(map(dict.get, self.containers, self.names))
        try:
            versions = list(map(_get_version, current))
        except (AttributeError, RuntimeError):  # a tensor set to None, an inference tensor
            return [
                slot
                for slot, t in zip(self.slots, current, strict=True)
                if t is not slot.tensor or (t is not None and (slot.version is None or _version(t) != slot.version))
            ]
        flags = map(
            operator.or_, map(operator.is_not, current, self.tensors), map(operator.ne, versions, self.versions)
        )
        return list(itertools.compress(self.slots, flags))

    def check(self, changed: list[_Slot]) -> tuple[list[str], Packed]:
        """After a batch: the observers that met NaN or infinite values in it (by name, in
        order), and the changed tensors packed (the state to keep, if none did)."""
        names = [
            name
            for (name, m), before in zip(self.counted, self.counts, strict=True)
            if getattr(m, NON_FINITE_ATTR, 0) != before
        ]
        packed = _pack(changed)
        for slots, buffer in packed:
            if not _finite(buffer):
                names += [s.owner for s in slots if not bool(torch.isfinite(s.container[s.key]).all())]
        return list(dict.fromkeys(names)), packed

    def non_finite(self) -> list[str]:
        """The observers that met NaN or infinite values in a batch that failed."""
        return self.check(self.changed_slots())[0]

    def commit(self, packed: Packed) -> None:
        """After a good batch: its state is the one to come back to."""
        _adopt(packed, self.tensors, self.versions)
        if sum(map(len, self.all_containers)) != self.registered:
            self._rescan()

    def restore(self) -> None:
        """After a failed batch: every tracked tensor and attribute as before it."""
        for slot in self.slots:
            slot.restore()
        self.tensors = [s.tensor for s in self.slots]
        self.versions = [s.version for s in self.slots]
        for current, plan, saved in zip(self.dicts, self.plans, self.attributes, strict=True):
            if plan is None:  # the whole __dict__ was copied
                assert isinstance(saved, dict)
                for key in [k for k in current if k not in saved]:
                    del current[key]
                for key, value in saved.items():
                    if key not in _MODULE_INTERNALS and current.get(key, _MISSING) is not value:
                        current[key] = value
                continue
            for key, value in zip(plan, saved, strict=True):
                if value is _MISSING:
                    current.pop(key, None)
                elif current.get(key, _MISSING) is not value:
                    current[key] = value
        for (_, obj), state in zip(self.objects, self.states, strict=True):
            obj.restore_state(state)
        for module, buffers, parameters in self.keys:
            for container, count in ((module._buffers, buffers), (module._parameters, parameters)):
                if len(container) != count:  # a tensor registered during the failed batch
                    tracked = {s.key for s in self.slots if s.container is container}
                    for key in [k for k in container if k not in tracked]:
                        del container[key]

    def _rescan(self) -> None:
        """Track the tensors an observer registered during a good batch."""
        tracked = {(id(s.container), s.key) for s in self.slots}
        added = [
            _Slot(name, container, key, self.tracked[id(module)])
            for name, module in self.modules
            for container in (module._buffers, module._parameters)
            for key in container
            if (id(container), key) not in tracked
        ]
        self.slots += added
        self._index()
        _adopt(_pack(added), self.tensors, self.versions)

    def _index(self) -> None:
        """Lookup tables for :meth:`changed_slots` and :meth:`commit`."""
        for i, slot in enumerate(self.slots):
            slot.index = i
        self.tensors = [s.tensor for s in self.slots]
        self.versions = [s.version for s in self.slots]
        self.containers = [s.container for s in self.slots]
        self.names = [s.key for s in self.slots]
        self.keys = [(m, len(m._buffers), len(m._parameters)) for _, m in self.modules]
        self.all_containers = [c for _, m in self.modules for c in (m._buffers, m._parameters)]
        self.registered = sum(map(len, self.all_containers))

"""Observing a weight once: what an observer records to skip a tensor it has already seen.

A weight is observed on every calibration batch, and the minimum of a minimum with the same
values is that minimum: an observer that saw this very tensor last time, unchanged since
(the same object at the same version counter), with its own min/max buffers untouched since,
can skip it. Used by ``quantweave.observers.PerChannelMinMaxObserver`` and
``PerGroupMinMaxObserver`` (``_modules/group_observer``), which keep the key in
``_last_seen``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

__all__ = ["remember", "state_key", "unchanged_since"]


def state_key(observer: Any, x: torch.Tensor) -> tuple[Any, ...] | None:
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


def unchanged_since(observer: Any, x: torch.Tensor) -> bool:
    """True when ``observer`` last observed this very tensor, and neither the tensor nor the
    observer's min/max buffers changed since (same objects, same version counters)."""
    last = getattr(observer, "_last_seen", None)
    if last is None:
        return False
    now = state_key(observer, x)
    if now is None:
        return False
    refs_same = all(now[i]() is last[i]() for i in (0, 2, 4))
    return refs_same and (now[1], now[3], now[5]) == (last[1], last[3], last[5])


def remember(observer: Any, x: torch.Tensor) -> None:
    observer._last_seen = state_key(observer, x)

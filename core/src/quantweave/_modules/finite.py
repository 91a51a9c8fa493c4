"""Finiteness of two small tensors (an observer's minima and maxima) in as few ops as possible.

Convert checks every observer's ``min_val`` / ``max_val`` (``is_calibrated``) and every
group-wise weight observer's (``group_quantize.observed_nan_free``); for an 8da4w model that
is a few dozen small tensors, and the per-op cost of the exact checks (a reduction and two
comparisons per tensor, each read back) added up (issue 25). Within
:func:`remembering_proofs` (convert's whole call), a pair proven finite is not summed again
while both tensors are the same objects at the same version counters: the second check of
a group-wise weight observer's range (``observed_nan_free`` after ``is_calibrated``) costs
no op.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["all_finite_pair", "remembering_proofs"]

#: (id(first), id(second)) -> (first, its version, second, its version) of the pairs proven
#: finite in the current remembering_proofs() block; None outside one
_PROVEN: contextvars.ContextVar[dict[tuple[int, int], tuple[Any, ...]] | None] = contextvars.ContextVar(
    "quantweave_finite_proofs", default=None
)


@contextlib.contextmanager
def remembering_proofs() -> Iterator[None]:
    """Within the block, :func:`all_finite_pair` remembers the pairs it proved finite (holding
    them until the block ends) and answers True for them again without an op while neither
    tensor changed (same objects, same version counters)."""
    token = _PROVEN.set({})
    try:
        yield
    finally:
        _PROVEN.reset(token)


def all_finite_pair(first: torch.Tensor, second: torch.Tensor, exact: Callable[[torch.Tensor], bool]) -> bool:
    """Whether ``exact(first) and exact(second)``, for an ``exact`` that is True for any tensor
    whose elements are all finite (the finite check itself, or a weaker one: no NaN).

    One sum of each first: an inf or NaN anywhere makes their total inf or NaN, so a finite
    total proves the answer True in three small ops and one read back; a total that is not
    finite (a non-finite element, or a sum that overflowed) is settled by ``exact``, tensor by
    tensor. A pair already proven finite in a :func:`remembering_proofs` block, unchanged
    since, is True at once."""
    floats = first.is_floating_point() and second.is_floating_point()
    if not floats:
        return exact(first) and exact(second)
    proven = _PROVEN.get()
    state = None if proven is None else _state(first, second)
    if state is not None and proven is not None and _same(proven.get((id(first), id(second))), state):
        return True
    if bool(torch.isfinite(first.detach().sum() + second.detach().sum())):
        if state is not None and proven is not None:
            proven[(id(first), id(second))] = state
        return True
    return exact(first) and exact(second)


def _state(first: torch.Tensor, second: torch.Tensor) -> tuple[Any, ...] | None:
    try:
        return (first, first._version, second, second._version)
    except RuntimeError:  # inference tensors keep no version counter: never remembered
        return None


def _same(before: tuple[Any, ...] | None, now: tuple[Any, ...]) -> bool:
    return (
        before is not None
        and before[0] is now[0]
        and before[2] is now[2]
        and before[1] == now[1]
        and before[3] == now[3]
    )

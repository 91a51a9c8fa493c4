"""Finiteness of two small tensors (an observer's minima and maxima) in as few ops as possible.

Convert checks every observer's ``min_val`` / ``max_val`` (``is_calibrated``) and every
group-wise weight observer's (``group_quantize.observed_nan_free``); for an 8da4w model that
is a few dozen small tensors, and the per-op cost of the exact checks (a reduction and two
comparisons per tensor, each read back) added up (issue 25).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["all_finite_pair"]


def all_finite_pair(first: torch.Tensor, second: torch.Tensor, exact: Callable[[torch.Tensor], bool]) -> bool:
    """Whether ``exact(first) and exact(second)``, for an ``exact`` that is True for any tensor
    whose elements are all finite (the finite check itself, or a weaker one: no NaN).

    One sum of each first: an inf or NaN anywhere makes their total inf or NaN, so a finite
    total proves the answer True in three small ops and one read back; a total that is not
    finite (a non-finite element, or a sum that overflowed) is settled by ``exact``, tensor by
    tensor."""
    floats = first.is_floating_point() and second.is_floating_point()
    if floats and bool(torch.isfinite(first.detach().sum() + second.detach().sum())):
        return True
    return exact(first) and exact(second)

"""Quantize a group-wise weight (``quantize_per_channel_group``) in fewer passes, same integers.

``quantized_decomposed.quantize_per_channel_group`` makes six passes over a weight, each
allocating a float32 temporary of its size: a NaN check (``isnan(x).sum()``, the slowest
of them), ``x * (1 / scale)``, ``+ zero_point``, ``round``, ``clamp`` and the cast. Convert
quantizes the large weights of an LLM this way (8da4w linears, 4-bit tables), and these
passes were most of its time (issue 25). :func:`quantize_weight` computes the same
arithmetic on blocks of rows (the temporaries are those of one block, as
:mod:`.chunked_quantize`'s), in place on one temporary per block:

- the same expressions in the same order on the same values: ``x.mul(1.0 / scales)``
  (float32; ``1.0 / scales`` is ``scales.reciprocal() * 1.0``, taken block by block),
  ``+ zero_points``, round half to even, clamp, cast: every integer is the op's
  (``tests/core/test_group_quantize.py`` compares them, NaN and ties included);
- the NaN check is a sum per block (NaN in, NaN out), and ``isnan`` only when that sum is
  NaN: the op's ``AssertionError`` for a NaN, with its message;
- ``+ zero_points`` is skipped when every zero point is 0 (symmetric groups): ``x + 0`` is
  ``x`` but for the sign of a zero, which no integer keeps.

A weight of one block or less is one block here too (the op's Python decomposition costs
about twice as much on a 128 x 128 weight). Anything else (other ops, dtypes, layouts) goes to
:func:`.chunked_quantize.quantize_constant` as before.
"""

from __future__ import annotations

from typing import Any

import torch

from . import chunked_quantize
from .finite import all_finite_pair
from .group_observer import PerGroupMinMaxObserver
from .observed_once import unchanged_since
from .torch_compat import quantized_decomposed_ops

__all__ = ["new_workspace", "observed_nan_free", "qparams_valid", "quantize_groups", "quantize_weight"]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INTEGERS = (torch.int8, torch.uint8, torch.int16, torch.int32)
_ZERO_POINTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def new_workspace() -> chunked_quantize.Workspace:
    """The float32 block buffer one convert quantizes all its weights in (allocated on first use)."""
    return chunked_quantize.Workspace(chunked_quantize.BLOCK_ELEMENTS)


def quantize_weight(
    q_op: Any,
    value: Any,
    args: tuple[Any, ...],
    workspace: chunked_quantize.Workspace | None = None,
    *,
    nan_free: bool = False,
) -> Any:
    """``q_op(value, *args)`` (a quantize op convert emits, its qparams evaluated), computed
    by :func:`quantize_groups` or :func:`.chunked_quantize.quantize_affine_rows` where they
    apply (their float32 temporaries in ``workspace``, reused by every weight it is given
    for: one per convert), else by ``quantize_constant``."""
    block_elements = chunked_quantize.BLOCK_ELEMENTS
    if workspace is None or workspace.block_elements != block_elements:
        workspace = chunked_quantize.Workspace(block_elements)
    if q_op == quantized_decomposed_ops().quantize_per_channel_group.default:
        result = quantize_groups(value, args, block_elements, workspace, nan_free)
    else:
        result = chunked_quantize.quantize_affine_rows(q_op, value, args, workspace)
    if result is not None:
        return result
    return chunked_quantize.quantize_constant(q_op, value, args, block_elements)


def quantize_groups(
    value: Any,
    args: tuple[Any, ...],
    block_elements: int,
    workspace: chunked_quantize.Workspace | None = None,
    nan_free: bool = False,
) -> torch.Tensor | None:
    """``quantize_per_channel_group(value, *args)`` for a 2-D float weight (whose rows fit in
    ``block_elements``) with float32 scales and integer zero points, one per group;
    None for anything else (the caller computes it with the op). ``nan_free``: ``value`` is
    known to hold no NaN (the op's NaN check, a pass over the weight, is left out)."""
    if len(args) != 6 or not isinstance(value, torch.Tensor):
        return None
    scales, zero_points, quant_min, quant_max, dtype, group_size = args
    if not (
        isinstance(scales, torch.Tensor)
        and isinstance(zero_points, torch.Tensor)
        and isinstance(group_size, int)
        and isinstance(quant_min, int)
        and isinstance(quant_max, int)
        and value.dim() == 2
        and value.dtype in _FLOATS
        and value.shape[1] <= block_elements  # a block holds at least one whole row
        and group_size > 1
        and value.shape[1] % group_size == 0
        and scales.dtype == torch.float32
        and zero_points.dtype in _ZERO_POINTS
        and dtype in _INTEGERS
        and scales.device == value.device == zero_points.device
    ):
        return None
    rows, columns = value.shape
    groups = rows * (columns // group_size)
    if scales.numel() != groups or zero_points.numel() != groups:
        return None
    scales = scales.reshape(-1, 1)
    # any zero point not 0? one aminmax (a fifth of any()'s time on an LLM table's 10^5 int32 zero points)
    low, high = torch.aminmax(zero_points.reshape(-1))
    offsets = zero_points.reshape(-1, 1) if bool(low != 0) or bool(high != 0) else None
    per_row = columns // group_size
    step = min(rows, max(1, block_elements // columns))  # rows per block
    # the op's 1.0 / scales is Tensor.__rtruediv__: scales.reciprocal() * 1.0, the reciprocals'
    # bits (* 1.0 changes no float); taken block by block into one small buffer
    inverse = torch.empty((step * per_row, 1), dtype=torch.float32, device=value.device)
    out = torch.empty(value.shape, dtype=dtype, device=value.device)
    if step == rows:  # one block: a temporary of the weight's size (the workspace is for larger weights)
        full_work = torch.empty(value.numel(), dtype=torch.float32, device=value.device).view(-1, group_size)
    else:
        if workspace is None or workspace.block_elements < block_elements:
            workspace = chunked_quantize.Workspace(block_elements)
        full_work = workspace.take(step * columns, value.device).view(-1, group_size)
    # views made once, not per block (a block is then a slice of each: fewer ops per block,
    # the same elements in the same places); a non-contiguous weight is reshaped block by block
    groups_of = value.view(-1, group_size) if value.is_contiguous() else None
    out_groups = out.view(-1, group_size)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        first, last = start * per_row, stop * per_row
        block = groups_of[first:last] if groups_of is not None else value[start:stop].reshape(-1, group_size)
        if not nan_free and torch.isnan(block.sum()) and bool(torch.isnan(block).any()):
            raise AssertionError("to_quant must not contain NaNs")  # the op's error
        work = full_work if last - first == full_work.shape[0] else full_work[: last - first]
        inverses = inverse if last - first == inverse.shape[0] else inverse[: last - first]
        torch.reciprocal(scales[first:last], out=inverses)
        torch.mul(block, inverses, out=work)
        if offsets is not None:
            work.add_(offsets[first:last])
        work.round_()
        work.clamp_(quant_min, quant_max)
        out_groups[first:last].copy_(work)
    return out


def observed_nan_free(observer: Any, value: Any) -> bool:
    """True when ``observer`` proves ``value`` holds no NaN: it is a
    :class:`~quantweave.observers.PerGroupMinMaxObserver` (its own ``forward``: ``amin`` /
    ``amax``, then ``torch.minimum`` / ``maximum`` with what it held, all of which carry a NaN
    into the result), it last observed this very tensor, unchanged since, and neither its
    minima nor its maxima hold a NaN. (A NaN weight gives a NaN scale, which convert rejects
    before quantizing anyway.)"""
    if not isinstance(value, torch.Tensor) or not isinstance(observer, PerGroupMinMaxObserver):
        return False
    if type(observer).forward is not PerGroupMinMaxObserver.forward or not unchanged_since(observer, value):
        return False
    low, high = observer.min_val, observer.max_val
    return bool(low.numel()) and all_finite_pair(low, high, _no_nan)


def _no_nan(values: torch.Tensor) -> bool:
    return not bool(torch.isnan(values).any())


def qparams_valid(value: Any, positive: bool) -> bool:
    """True when every element of ``value`` (scales or zero points: a tensor or numbers) is
    finite, and > 0 with ``positive`` (no element: False with ``positive``, else True). One reduction of a float tensor
    in its own dtype (an LLM's group scales are 10^5-10^6 values, checked once each), none
    of an integer one; the same verdict as converting to float64 and checking there."""
    if isinstance(value, torch.Tensor) and not value.is_complex():
        if value.numel() == 0:
            return not positive
        if not value.is_floating_point():
            return not positive or bool((value > 0).all())
        low, high = torch.aminmax(value.detach().reshape(-1))  # NaN anywhere: both NaN
        return bool(high < float("inf")) and (bool(low > 0) if positive else bool(low > float("-inf")))
    as_float = torch.as_tensor(value, dtype=torch.float64)
    if positive and as_float.numel() == 0:
        return False
    return bool(torch.isfinite(as_float).all()) and (not positive or bool((as_float > 0).all()))

"""Quantize a constant (a weight) block of rows by block, into one preallocated result.

``quantized_decomposed``'s quantize ops are elementwise arithmetic on float32: on a whole
weight they allocate several float32 temporaries of its size (``x * (1 / scale)``, the
rounded values, the clamped ones; a bf16 / fp16 weight is first copied to float32), so
quantizing a 0.5 GB table briefly costs about 1 GB on top of the int8 result. Here the op
runs on blocks of rows along dimension 0 (each block's qparams sliced to match), each
block's result written into the output: the temporaries are those of one block. Every
element goes through the same arithmetic on the same values, so the result is identical
to the op's on the whole tensor (``tests/core/test_convert_memory.py``).

Per-tensor and per-channel (rows) quantizes of float weights go further
(:func:`quantize_affine_rows`): the op's expressions run in place in one float32 buffer of
one block (:class:`Workspace`), which a convert allocates once and reuses for every block
of every weight, each result allocated once at its final size before its first block. Convert
then allocates nothing but the results: no temporary is freed between two of them, so
glibc's heap cannot interleave results and freed temporaries (the spread of convert's
peak from one process to the next, issue 25).
"""

from __future__ import annotations

from typing import Any

import torch

from .torch_compat import quantized_decomposed_ops

__all__ = ["BLOCK_ELEMENTS", "Workspace", "quantize_affine_rows", "quantize_constant"]

#: elements per block: 1 MB of float32 temporaries each. Measured (benchmarks/bench_llm_memory.py,
#: 0.72 GB model, dynamic linears): with 4 MB blocks convert's peak grew by 0.24-0.51x the fp32
#: weights from run to run (glibc's heap: its mmap threshold rises to the size of a freed block,
#: then the int8 results and the temporaries interleave on the heap), with 1 MB blocks by 0.22-0.23x
#: (the int8 copy alone is 0.20x); 1 MB temporaries also stay in cache (0.42-0.52 CPU s per GB
#: against 0.60-0.73 for 4 MB blocks, per-channel int8, one thread; smaller blocks cost more in
#: per-op overhead: 0.8 s at 256 KB, 2.2-2.9 s at 64 KB)
BLOCK_ELEMENTS = 1 << 18


def quantize_constant(q_op: Any, value: Any, args: tuple[Any, ...], block_elements: int | None = None) -> Any:
    """``q_op(value, *args)`` (a quantize op convert emits, its qparams evaluated), computed
    in blocks of rows of at most ``block_elements`` (default :data:`BLOCK_ELEMENTS`)
    elements when ``value`` is larger."""
    block_elements = BLOCK_ELEMENTS if block_elements is None else block_elements
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.numel() <= block_elements:
        return q_op(value, *args)
    rows = value.shape[0]
    row_elements = max(1, value.numel() // rows)
    step = max(1, block_elements // row_elements)
    if step >= rows:
        return q_op(value, *args)
    slicer = _qparam_slicer(q_op, value, args)
    if slicer is None:
        return q_op(value, *args)
    # the result is allocated before any block's temporaries (its dtype from one row), so
    # freed temporaries leave no holes below it that the allocator cannot give back
    probe = q_op(value[0:1], *slicer(0, 1))
    out = torch.empty(value.shape, dtype=probe.dtype, device=probe.device)
    del probe
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        out[start:stop] = q_op(value[start:stop], *slicer(start, stop))
    return out


def _qparam_slicer(q_op: Any, value: torch.Tensor, args: tuple[Any, ...]) -> Any:
    """A function of (start, stop) giving ``args`` for the rows ``value[start:stop]``, or
    None for an op or qparams this does not know how to slice (computed whole then)."""
    qd = quantized_decomposed_ops()
    if q_op == qd.quantize_per_tensor.default:
        return lambda start, stop: args
    if q_op == qd.quantize_per_channel.default:
        scales, zero_points, axis = args[0], args[1], args[2]
        if not (isinstance(scales, torch.Tensor) and isinstance(zero_points, torch.Tensor)):
            return None
        if int(axis) % value.dim() != 0:  # qparams along another dimension: every block needs them all
            return lambda start, stop: args
        if scales.shape != (value.shape[0],) or zero_points.shape != (value.shape[0],):
            return None
        return lambda start, stop: (scales[start:stop], zero_points[start:stop], *args[2:])
    if q_op == qd.quantize_per_channel_group.default:
        scales, zero_points = args[0], args[1]
        rows = value.shape[0]
        if not (isinstance(scales, torch.Tensor) and isinstance(zero_points, torch.Tensor)) or value.dim() != 2:
            return None
        if scales.numel() % rows or zero_points.numel() != scales.numel():
            return None
        scales, zero_points = scales.reshape(rows, -1), zero_points.reshape(rows, -1)
        return lambda start, stop: (scales[start:stop], zero_points[start:stop], *args[2:])
    return None


class Workspace:
    """One float32 buffer of ``block_elements`` per device, allocated on first use and
    reused by every block of every weight quantized with it (convert makes one per call)."""

    def __init__(self, block_elements: int) -> None:
        self.block_elements = block_elements
        self._buffers: dict[torch.device, torch.Tensor] = {}

    def take(self, elements: int, device: torch.device) -> torch.Tensor:
        """The first ``elements`` (at most ``block_elements``) of the device's buffer."""
        buffer = self._buffers.get(device)
        if buffer is None:
            buffer = self._buffers[device] = torch.empty(self.block_elements, dtype=torch.float32, device=device)
        return buffer[:elements]


_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_ZERO_POINTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float32)


def quantize_affine_rows(q_op: Any, value: Any, args: tuple[Any, ...], workspace: Workspace) -> torch.Tensor | None:
    """``quantize_per_tensor`` / ``quantize_per_channel`` (along dimension 0) of a contiguous
    float weight of more than one block, in place in ``workspace``: the op's expressions in
    its order (``round(x * (1 / scale)) + zero_point``, clamp, cast; a bf16 / fp16 block
    converted to float32 first, as the op converts the whole weight), so every integer is
    the op's. None for anything else (other ops, qparams of other dtypes or shapes, layouts,
    weights of one block or less): the caller computes it as before."""
    qd = quantized_decomposed_ops()
    block_elements = workspace.block_elements
    if not (
        isinstance(value, torch.Tensor)
        and value.dtype in _FLOATS
        and value.dim() >= 1
        and value.numel() > block_elements
        and value.is_contiguous()
    ):
        return None
    rows = value.shape[0]
    row_elements = value.numel() // rows
    if row_elements > block_elements:
        return None
    if q_op == qd.quantize_per_tensor.default:
        if len(args) != 5:
            return None
        scale, zero_point, quant_min, quant_max, dtype = args
        if not (isinstance(scale, float) and isinstance(zero_point, int) and not isinstance(zero_point, bool)):
            return None
        inverse_scale = 1.0 / scale  # the op's Python float

        def multiplier(start: int, stop: int) -> Any:
            return inverse_scale

        def offset(start: int, stop: int) -> Any:
            return zero_point

    elif q_op == qd.quantize_per_channel.default:
        if len(args) != 6:
            return None
        scales, zero_points, axis, quant_min, quant_max, dtype = args
        if not (
            isinstance(scales, torch.Tensor)
            and isinstance(zero_points, torch.Tensor)
            and isinstance(axis, int)
            and axis % value.dim() == 0
            and scales.dtype == torch.float32
            and zero_points.dtype in _ZERO_POINTS
            and scales.shape == (rows,)
            and zero_points.shape == (rows,)
            and scales.device == value.device == zero_points.device
        ):
            return None
        inverses = (1.0 / scales).reshape(rows, 1)  # the op's expression, on the same float32 values
        offsets = zero_points.reshape(rows, 1)

        def multiplier(start: int, stop: int) -> Any:
            return inverses[start:stop]

        def offset(start: int, stop: int) -> Any:
            return offsets[start:stop]

    else:
        return None
    if not (isinstance(quant_min, int) and isinstance(quant_max, int) and isinstance(dtype, torch.dtype)):
        return None
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return None
    if not torch.iinfo(dtype).min <= quant_min <= quant_max <= torch.iinfo(dtype).max:
        return None  # the op's bounds check raises
    out = torch.empty(value.shape, dtype=dtype, device=value.device)  # the result, before any block
    flat, out_flat = value.view(rows, row_elements), out.view(rows, row_elements)
    step = max(1, block_elements // row_elements)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        block = flat[start:stop]
        work = workspace.take(block.numel(), value.device).view(block.shape)
        if block.dtype == torch.float32:
            torch.mul(block, multiplier(start, stop), out=work)
        else:
            work.copy_(block)  # the op's .to(torch.float32), one block at a time
            work.mul_(multiplier(start, stop))
        work.round_()
        work.add_(offset(start, stop))
        work.clamp_(quant_min, quant_max)
        out_flat[start:stop].copy_(work)  # the op's .to(dtype)
    return out

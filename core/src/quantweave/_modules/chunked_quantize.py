"""Quantize a constant (a weight) block of rows by block, into one preallocated result.

``quantized_decomposed``'s quantize ops are elementwise arithmetic on float32: on a whole
weight they allocate several float32 temporaries of its size (``x * (1 / scale)``, the
rounded values, the clamped ones; a bf16 / fp16 weight is first copied to float32), so
quantizing a 0.5 GB table briefly costs about 1 GB on top of the int8 result. Here the op
runs on blocks of rows along dimension 0 (each block's qparams sliced to match), each
block's result written into the output: the temporaries are those of one block. Every
element goes through the same arithmetic on the same values, so the result is identical
to the op's on the whole tensor (``tests/core/test_convert_memory.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from .torch_compat import quantized_decomposed_ops

__all__ = ["BLOCK_ELEMENTS", "quantize_constant"]

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

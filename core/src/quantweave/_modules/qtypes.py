"""The integer dtypes and qschemes quantweave quantizes to: one table, used everywhere.

Annotation validation, observer construction (sharing), convert and the capability
descriptions all ask these functions rather than keeping their own tuples or calling
``torch.iinfo``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

__all__ = [
    "FLOAT8_DTYPES",
    "INTEGER_DTYPES",
    "INTEGER_DTYPE_RANGES",
    "PLACEHOLDER_DTYPES",
    "PER_CHANNEL_QSCHEMES",
    "PER_TENSOR_QSCHEMES",
    "QSCHEMES",
    "SYMMETRIC_QSCHEMES",
    "dtype_range",
    "granularity",
    "float8_range",
    "integer_dtype",
    "is_float8_dtype",
    "is_integer_dtype",
    "is_placeholder_dtype",
    "is_per_channel",
    "is_per_tensor",
    "is_symmetric",
]

#: dtype -> (min, max) of every integer dtype a spec may quantize to
_RANGES: dict[torch.dtype, tuple[int, int]] = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.uint16: (0, 65535),
    torch.int16: (-32768, 32767),
    torch.int32: (-(2**31), 2**31 - 1),
}
#: the integer dtypes, in the order error messages list them
INTEGER_DTYPES: tuple[torch.dtype, ...] = tuple(_RANGES)
#: read-only view: integer dtype -> (min, max)
INTEGER_DTYPE_RANGES: Mapping[torch.dtype, tuple[int, int]] = MappingProxyType(_RANGES)

#: the float8 dtypes a spec may quantize to (scale and zero point as for an integer dtype, the
#: rounded values stored as float8 -- what torch's quantized_decomposed ops do for them)
FLOAT8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)
#: float dtypes a spec may name as a *placeholder*: nothing is quantized (float32, bfloat16:
#: the tensor is left as it is; float16: rounded through float16 and back, as torchao does)
PLACEHOLDER_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)

#: torch's quantized dtypes (what older observers report as ``dtype``) -> their integer dtype
_QUANTIZED_TO_INTEGER: dict[torch.dtype, torch.dtype] = {
    torch.quint8: torch.uint8,
    torch.qint8: torch.int8,
    torch.qint32: torch.int32,
}

PER_TENSOR_QSCHEMES: tuple[torch.qscheme, ...] = (torch.per_tensor_affine, torch.per_tensor_symmetric)
PER_CHANNEL_QSCHEMES: tuple[torch.qscheme, ...] = (
    torch.per_channel_affine,
    torch.per_channel_symmetric,
    torch.per_channel_affine_float_qparams,
)
#: every qscheme a spec may name, per-tensor first
QSCHEMES: tuple[torch.qscheme, ...] = PER_TENSOR_QSCHEMES + PER_CHANNEL_QSCHEMES
SYMMETRIC_QSCHEMES: tuple[torch.qscheme, ...] = (torch.per_tensor_symmetric, torch.per_channel_symmetric)


def is_integer_dtype(dtype: Any) -> bool:
    """True for the integer dtypes of :data:`INTEGER_DTYPES` (not for torch.q* dtypes)."""
    return isinstance(dtype, torch.dtype) and dtype in _RANGES


def dtype_range(dtype: Any) -> tuple[int, int]:
    """``(min, max)`` of an integer dtype; ValueError naming the supported ones otherwise."""
    if not is_integer_dtype(dtype):
        names = ", ".join(str(d) for d in INTEGER_DTYPES)
        raise ValueError(f"expected an integer dtype ({names}); got {dtype!r}")
    return _RANGES[dtype]


def is_float8_dtype(dtype: Any) -> bool:
    """True for the float8 dtypes of :data:`FLOAT8_DTYPES`."""
    return isinstance(dtype, torch.dtype) and dtype in FLOAT8_DTYPES


def is_placeholder_dtype(dtype: Any) -> bool:
    """True for the float dtypes of :data:`PLACEHOLDER_DTYPES` (a spec that quantizes nothing)."""
    return isinstance(dtype, torch.dtype) and dtype in PLACEHOLDER_DTYPES


def float8_range(dtype: torch.dtype) -> tuple[int, int]:
    """``(-max, max)`` of a float8 dtype, as ints (the bounds quant_min / quant_max may take)."""
    high = int(torch.finfo(dtype).max)
    return -high, high


def integer_dtype(dtype: Any) -> Any:
    """``dtype`` with torch's quantized dtypes (quint8, qint8, qint32) mapped to their integer
    dtype; anything else is returned as is."""
    return _QUANTIZED_TO_INTEGER.get(dtype, dtype)


def is_per_tensor(qscheme: Any) -> bool:
    return qscheme in PER_TENSOR_QSCHEMES


def is_per_channel(qscheme: Any) -> bool:
    return qscheme in PER_CHANNEL_QSCHEMES


def is_symmetric(qscheme: Any) -> bool:
    return qscheme in SYMMETRIC_QSCHEMES


def granularity(qscheme: Any) -> str:
    """``"per_channel_float_qparams"``, ``"per_channel"`` or ``"per_tensor"`` (also for None)."""
    if qscheme == torch.per_channel_affine_float_qparams:
        return "per_channel_float_qparams"
    if is_per_channel(qscheme):
        return "per_channel"
    return "per_tensor"

"""The per-group min/max observer behind group-wise ``QuantizationSpec`` s (``group_size``).

Re-exported as :class:`quantweave.observers.PerGroupMinMaxObserver`. It observes a 2-D
tensor (a weight: rows are channels) and keeps, for every row and every run of
``group_size`` consecutive elements along it, the running minimum and maximum;
``calculate_qparams`` returns ``(scales, zero_points)`` of shape ``(rows, columns //
group_size)``, the layout ``quantized_decomposed.quantize_per_channel_group`` takes.
A weight observed on every calibration batch is reduced once: the observer skips the tensor
it saw last time when neither it nor the observer's min/max changed since
(``_modules/observed_once``).
"""

from __future__ import annotations

from typing import Any

import torch

from .observed_once import remember, unchanged_since
from .qtypes import dtype_range, integer_dtype
from .torch_compat import ObserverBase

__all__ = ["PerGroupMinMaxObserver"]

_GROUP_QSCHEMES = (torch.per_channel_symmetric, torch.per_channel_affine)


class PerGroupMinMaxObserver(ObserverBase):
    """Min/max per row and per group of ``group_size`` elements of a 2-D tensor.

    ``qscheme=torch.per_channel_symmetric``: ``scale = max(|min|, |max|) / ((quant_max -
    quant_min) / 2)``, zero point 0 (the middle of the range for unsigned dtypes), as
    torch's symmetric observers compute it. ``torch.per_channel_affine``: ``scale = (max -
    min) / (quant_max - quant_min)`` over a range widened to include 0, and the zero point
    that maps the minimum to ``quant_min``. Scales are at least ``eps``.
    """

    min_val: torch.Tensor
    max_val: torch.Tensor
    _last_seen: tuple[Any, ...] | None = None

    def __init__(
        self,
        group_size: int,
        ch_axis: int = 0,
        dtype: torch.dtype = torch.int8,
        qscheme: torch.qscheme = torch.per_channel_symmetric,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = float(torch.finfo(torch.float32).eps),
        is_dynamic: bool = False,
        **kwargs: Any,
    ) -> None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
            raise ValueError(f"PerGroupMinMaxObserver: group_size must be an int >= 2; got {group_size!r}")
        if ch_axis != 0:
            raise ValueError(f"PerGroupMinMaxObserver: qparams are per row (ch_axis=0); got ch_axis={ch_axis}")
        if qscheme not in _GROUP_QSCHEMES:
            raise ValueError(
                f"PerGroupMinMaxObserver: qscheme must be torch.per_channel_symmetric or torch.per_channel_affine; "
                f"got {qscheme}"
            )
        if is_dynamic:
            raise ValueError("PerGroupMinMaxObserver: group-wise quantization is static; got is_dynamic=True")
        if kwargs:
            raise TypeError(f"PerGroupMinMaxObserver: unexpected arguments {sorted(kwargs)}")
        super().__init__(dtype=dtype, is_dynamic=False)
        lo, hi = dtype_range(integer_dtype(dtype))
        self.group_size = group_size
        self.ch_axis = 0
        self.qscheme = qscheme
        self.quant_min = lo if quant_min is None else int(quant_min)
        self.quant_max = hi if quant_max is None else int(quant_max)
        if not lo <= self.quant_min < self.quant_max <= hi:
            raise ValueError(
                f"PerGroupMinMaxObserver: expected {lo} <= quant_min < quant_max <= {hi} for {dtype}; got "
                f"[{self.quant_min}, {self.quant_max}]"
            )
        self.eps = float(eps)
        self.register_buffer("min_val", torch.tensor([]))
        self.register_buffer("max_val", torch.tensor([]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:
            return x
        if x.dim() != 2:
            raise ValueError(
                f"PerGroupMinMaxObserver: group-wise quantization observes 2-D tensors (rows x columns); got shape "
                f"{tuple(x.shape)}"
            )
        rows, columns = x.shape
        if columns % self.group_size:
            raise ValueError(
                f"PerGroupMinMaxObserver: rows of {columns} elements do not split into groups of {self.group_size}"
            )
        if unchanged_since(self, x):  # a weight seen on the last batch: its min/max are those recorded
            return x
        # reduced in the input's dtype, then converted (a bf16 weight is never copied whole to
        # float32; rounding is monotonic, so the converted minimum is the minimum converted)
        groups = x.detach().reshape(rows, columns // self.group_size, self.group_size)
        lo, hi = groups.amin(-1).to(torch.float32), groups.amax(-1).to(torch.float32)
        if self.min_val.numel() == 0:
            self.min_val = lo
            self.max_val = hi
        else:
            if self.min_val.shape != lo.shape:
                raise ValueError(
                    f"PerGroupMinMaxObserver: observed {tuple(lo.shape)} (rows, groups) after "
                    f"{tuple(self.min_val.shape)}"
                )
            self.min_val = torch.minimum(self.min_val, lo)
            self.max_val = torch.maximum(self.max_val, hi)
        remember(self, x)
        return x

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        if self.min_val.numel() == 0:
            raise RuntimeError("PerGroupMinMaxObserver: calculate_qparams before any data was observed")
        qmin, qmax = self.quant_min, self.quant_max
        if self.qscheme == torch.per_channel_symmetric and self.eps > 0:
            # max(|min(min_val, 0)|, max(max_val, 0)) / half range, at least eps, in two ops fewer:
            # max(-min_val, max_val) differs from it only where both are negative (or a zero's
            # sign), where both quotients are <= 0 < eps and the scale is eps; NaN and inf carry alike
            amax = torch.neg(self.min_val)
            torch.maximum(amax, self.max_val, out=amax)  # in place: one temporary of the scales' size, not two
            scale = amax.div_((qmax - qmin) / 2).clamp_(min=self.eps)
            middle = 0 if dtype_range(integer_dtype(self.dtype))[0] < 0 else (qmin + qmax + 1) // 2
            zero_point = torch.full_like(scale, middle, dtype=torch.int32)
            return scale.to(torch.float32), zero_point
        min_neg = torch.clamp(self.min_val, max=0.0)
        max_pos = torch.clamp(self.max_val, min=0.0)
        if self.qscheme == torch.per_channel_symmetric:
            amax = torch.maximum(-min_neg, max_pos)
            scale = torch.clamp(amax / ((qmax - qmin) / 2), min=self.eps)
            middle = 0 if dtype_range(integer_dtype(self.dtype))[0] < 0 else (qmin + qmax + 1) // 2
            zero_point = torch.full_like(scale, middle, dtype=torch.int32)
        else:
            scale = torch.clamp((max_pos - min_neg) / (qmax - qmin), min=self.eps)
            zero_point = torch.clamp(qmin - torch.round(min_neg / scale), qmin, qmax).to(torch.int32)
        return scale.to(torch.float32), zero_point

    def extra_repr(self) -> str:
        return (
            f"group_size={self.group_size}, dtype={self.dtype}, qscheme={self.qscheme}, "
            f"quant_min={self.quant_min}, quant_max={self.quant_max}"
        )

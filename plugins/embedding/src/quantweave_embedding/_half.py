"""Half-precision table scales: observers whose qparams are float16 values.

``EmbeddingConfig(scale_dtype=torch.float16)`` quantizes a symmetric group-wise table with
this observer: the scale of each row and group is rounded *up* to the next float16 value
(never down, so no element that fitted the range is clipped) and the integers are computed
with it. The converted model keeps the scales as float32 tensors holding float16 values, so
a lowering may store them in float16 without changing a single output
(``quantweave_executorch`` does: ExecuTorch 1.5.1's ``embedding_4bit`` / ``embedding_byte``
``.dtype`` kernels read float16 scales and write float32 rows).

Tables with zero points (8-bit rows, ``symmetric=False`` groups) are not offered: ExecuTorch
1.5.1's ahead-of-time checks want the zero points in the scales' dtype and its runtime kernels
want them in the output's dtype (float32), so half scales with zero points do not run.

The cost: a scale up to 2**-11 (0.05 %) larger than the float32 one, so the step of every
element of the row or group grows by at most that much. The gain: 2 bytes per scale
instead of 4 (for 4-bit tables in groups of 32, 0.5625 instead of 0.625 bytes per element).
"""

from __future__ import annotations

import torch

from quantweave.observers import PerGroupMinMaxObserver

__all__ = ["HalfScalePerGroupMinMaxObserver", "round_up_to_half"]

_HALF_MAX = float(torch.finfo(torch.float16).max)
_HALF_TINY = float(torch.finfo(torch.float16).tiny)


def round_up_to_half(scale: torch.Tensor, where: str) -> torch.Tensor:
    """``scale`` (positive, finite) rounded up to float16 values, returned as float32.

    Raises ValueError naming ``where`` when a scale is beyond float16's range (larger than
    65504) or below its smallest normal value (6.1e-05): a table with such steps cannot be
    stored with half-precision scales without losing precision."""
    scale = scale.detach().to(torch.float32)
    if scale.numel() and (float(scale.max()) > _HALF_MAX or float(scale.min()) < _HALF_TINY):
        raise ValueError(
            f"{where}: scale_dtype=torch.float16 needs every scale in float16's normal range "
            f"[{_HALF_TINY:.3g}, {_HALF_MAX:.0f}]; got scales in [{float(scale.min()):.3g}, {float(scale.max()):.3g}] "
            "(use scale_dtype=torch.float32 for this table)"
        )
    half = scale.to(torch.float16)
    below = half.to(torch.float32) < scale
    half = torch.where(below, torch.nextafter(half, torch.full_like(half, float("inf"))), half)
    return half.to(torch.float32)


class HalfScalePerGroupMinMaxObserver(PerGroupMinMaxObserver):
    """``PerGroupMinMaxObserver`` (symmetric) whose scales are float16 values, rounded up."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if self.qscheme != torch.per_channel_symmetric:
            raise ValueError(
                f"HalfScalePerGroupMinMaxObserver: half-precision scales are for symmetric groups (no zero points); "
                f"got qscheme={self.qscheme}"
            )

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        scale, zero_point = super().calculate_qparams()
        return round_up_to_half(scale, type(self).__name__), zero_point

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scales float16"

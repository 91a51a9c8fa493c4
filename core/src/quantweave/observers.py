"""The single place quantweave takes observers and fake-quantizers from.

Everything else in quantweave imports observer classes from here, so a torch without
``torch.ao.quantization`` needs one change: this module. ``DerivedObserver`` and the
calibration check are our own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.ao.quantization.fake_quantize import (
    FakeQuantize,
    FakeQuantizeBase,
    FixedQParamsFakeQuantize,
)
from torch.ao.quantization.observer import (
    FixedQParamsObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)

__all__ = [
    "DerivedObserver",
    "FakeQuantize",
    "FakeQuantizeBase",
    "FixedQParamsFakeQuantize",
    "FixedQParamsObserver",
    "HistogramObserver",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "ObserverBase",
    "PerChannelMinMaxObserver",
    "PlaceholderObserver",
    "is_observer_module",
    "is_calibrated",
]


class DerivedObserver(ObserverBase):
    """Observes nothing; its qparams are ``derive_qparams_fn(sources)``.

    ``sources`` are the observers of the edges/nodes the spec derives from. They are kept
    in a plain list (not registered as submodules) so they are owned by the graph once.
    """

    def __init__(
        self,
        sources: Sequence[torch.nn.Module],
        derive_qparams_fn: Callable[[list[Any]], tuple[torch.Tensor, torch.Tensor]],
        dtype: torch.dtype,
        quant_min: int,
        quant_max: int,
        qscheme: torch.qscheme,
        ch_axis: int | None = None,
    ) -> None:
        super().__init__(dtype=dtype, is_dynamic=False)
        self.sources = list(sources)
        self.derive_qparams_fn = derive_qparams_fn
        self.quant_min = quant_min
        self.quant_max = quant_max
        self.qscheme = qscheme
        self.ch_axis = ch_axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return self.derive_qparams_fn(self.sources)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, qscheme={self.qscheme}, sources={len(self.sources)}"


def is_observer_module(module: object) -> bool:
    """True for observer and fake-quantize modules that convert turns into q/dq ops."""
    return isinstance(module, (ObserverBase, FakeQuantizeBase))


def is_calibrated(module: torch.nn.Module) -> bool:
    """False when an observer that learns from data has seen none.

    Fixed, placeholder (dynamic) and derived observers need no data of their own.
    """
    if isinstance(module, FakeQuantizeBase):
        inner = getattr(module, "activation_post_process", None)
        return inner is None or is_calibrated(inner)
    if isinstance(module, (FixedQParamsObserver, PlaceholderObserver, DerivedObserver)):
        return True
    min_val = getattr(module, "min_val", None)
    max_val = getattr(module, "max_val", None)
    if not isinstance(min_val, torch.Tensor) or not isinstance(max_val, torch.Tensor):
        return True
    if min_val.numel() == 0 or max_val.numel() == 0:
        return False
    return bool(torch.isfinite(min_val).all() and torch.isfinite(max_val).all())

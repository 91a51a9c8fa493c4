"""Observer / fake-quantize constructors for the usual recipes (post-training, dynamic, QAT)."""

from __future__ import annotations

from typing import Any

from ..observers import (
    FakeQuantize,
    FusedMovingAvgObsFakeQuantize,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)

__all__ = ["activation_observer", "weight_observer"]

#: The smallest scale the PT2E recipes allow (torchao's x86 / XNNPACK configs use it).
DEFAULT_EPS = 2**-12


def activation_observer(*, is_qat: bool = False, is_dynamic: bool = False, eps: float = DEFAULT_EPS) -> Any:
    """The constructor of an activation observer, as PT2E's x86 and XNNPACK recipes build it:

    - post-training static: ``HistogramObserver``; dynamic: ``PlaceholderObserver`` (the
      qparams are chosen at run time);
    - QAT static: ``FusedMovingAvgObsFakeQuantize``; QAT dynamic: ``FakeQuantize`` over a
      ``MovingAverageMinMaxObserver`` with averaging constant 1.

    Use it as ``QuantizationSpec(observer_or_fake_quant_ctr=activation_observer(...))``."""
    if is_qat and is_dynamic:
        return FakeQuantize.with_args(eps=eps, observer=MovingAverageMinMaxObserver.with_args(averaging_constant=1))
    if is_qat:
        return FusedMovingAvgObsFakeQuantize.with_args(eps=eps)
    return (PlaceholderObserver if is_dynamic else HistogramObserver).with_args(eps=eps)


def weight_observer(*, per_channel: bool = True, is_qat: bool = False, eps: float = DEFAULT_EPS) -> Any:
    """The constructor of a weight observer: ``PerChannelMinMaxObserver`` /
    ``MinMaxObserver`` post-training; under QAT a ``FusedMovingAvgObsFakeQuantize`` over
    ``MovingAveragePerChannelMinMaxObserver`` / ``MovingAverageMinMaxObserver``."""
    if is_qat:
        observer = MovingAveragePerChannelMinMaxObserver if per_channel else MovingAverageMinMaxObserver
        return FusedMovingAvgObsFakeQuantize.with_args(eps=eps, observer=observer)
    return (PerChannelMinMaxObserver if per_channel else MinMaxObserver).with_args(eps=eps)

"""One ONNX Runtime recipe setting (:class:`ORTConfig`) and the specs it gives (:class:`Recipe`).

An :class:`ORTQuantizer` holds a global config and, like the other plugins' quantizers, configs
by module name, module type and operator type (resolved by ``quantweave.authoring.ConfigStages``:
module name > module type > operator type > global). The mode (static, dynamic, QAT) belongs to
the quantizer, not to a config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

import quantweave as qw
from quantweave.observers import (
    FakeQuantize,
    FusedMovingAvgObsFakeQuantize,
    HistogramObserver,
    MinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)

from ._capabilities import BIAS_RANGE, resolve_matmul_const_b_only, weight_range

__all__ = ["ACTIVATION_DTYPES", "OBSERVERS", "ORTConfig", "Recipe"]

ACTIVATION_DTYPES = ("uint8", "int8")
OBSERVERS = ("histogram", "minmax")


@dataclass(frozen=True)
class ORTConfig:
    """How the ops a config covers are quantized (the options of ONNX Runtime's ``quantize_static``).

    ``activation_dtype``: ``"uint8"`` (affine [0, 255], ORT's ``QuantType.QUInt8``) or ``"int8"``
    (affine [-128, 127], ``QInt8``); ``symmetric_activations``: int8 [-127, 127] with zero point 0
    (``ActivationSymmetric``; needs ``activation_dtype="int8"``); ``observer``: ``"minmax"``
    (None, the default, resolves to it: ``quantize_static``'s default ``CalibrationMethod.MinMax``,
    so that ours calibrates the qparams ORT's own quantizer gives) or ``"histogram"`` (torch's
    HistogramObserver, which searches the range that minimizes the quantization error; better or
    worse than MinMax depending on the model); ``per_channel``:
    int8 weights per output channel (default) or per tensor; ``reduce_range``: 7-bit weights,
    [-64, 64] (CPUs without VNNI); ``int32_bias``: the bias of a conv, a transposed conv and a
    linear on 2-D input (ONNX Conv / ConvTranspose / Gemm) as int32 with scale input scale x
    weight scale and zero point 0, as ``quantize_static`` writes it (its ``QuantizeBias``
    option); in the static mode only. ``matmul_const_b_only``: quantize a matmul only when its
    second operand is a constant (a weight), as ORT's ``MatMulConstBOnly`` extra option; None
    (default) takes ORT's default for the mode: True in the dynamic mode (``quantize_dynamic``
    sets it: the activation x activation matmuls of attention stay float), False otherwise
    (``quantize_static`` quantizes them, ``QLinearMatMul``)."""

    activation_dtype: str = "uint8"
    per_channel: bool = True
    observer: str | None = None
    reduce_range: bool = False
    symmetric_activations: bool = False
    int32_bias: bool = True
    matmul_const_b_only: bool | None = None

    def __post_init__(self) -> None:
        if self.activation_dtype not in ACTIVATION_DTYPES:
            raise ValueError(
                f"ORTQuantizer: activation_dtype must be one of {', '.join(ACTIVATION_DTYPES)}; "
                f"got {self.activation_dtype!r}"
            )
        for option in ("per_channel", "reduce_range", "symmetric_activations", "int32_bias"):
            value = getattr(self, option)
            if not isinstance(value, bool):
                raise TypeError(f"ORTQuantizer: {option} must be a bool; got {value!r}")
        if self.matmul_const_b_only is not None and not isinstance(self.matmul_const_b_only, bool):
            raise TypeError(
                f"ORTQuantizer: matmul_const_b_only must be a bool or None; got {self.matmul_const_b_only!r}"
            )
        if self.observer is not None and self.observer not in OBSERVERS:
            raise ValueError(f"ORTQuantizer: observer must be one of {', '.join(OBSERVERS)}; got {self.observer!r}")
        if self.symmetric_activations and self.activation_dtype != "int8":
            raise ValueError(
                "ORTQuantizer: symmetric_activations=True takes activation_dtype='int8' (ORT's QInt8 with "
                f"ActivationSymmetric); got activation_dtype={self.activation_dtype!r}"
            )
        if self.observer is None:
            object.__setattr__(self, "observer", "minmax")


def _bias_qparams(observers: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 bias qparams: scale = input scale x weight scale (per weight channel), zero point 0."""
    act, weight = observers
    act_scale, _ = act.calculate_qparams()
    weight_scale, _ = weight.calculate_qparams()
    scale = (act_scale.to(torch.float32) * weight_scale.to(torch.float32)).reshape(-1)
    return scale, torch.zeros_like(scale, dtype=torch.int32)


class Recipe:
    """The specs one :class:`ORTConfig` gives in one mode (built once per config and quantizer)."""

    def __init__(self, config: ORTConfig, is_dynamic: bool = False, is_qat: bool = False) -> None:
        self.config = config
        self.is_qat = is_qat
        self.is_dynamic = is_dynamic
        ctr: Any
        if is_qat:
            ctr = FusedMovingAvgObsFakeQuantize.with_args(eps=2**-12)
        elif is_dynamic:
            ctr = PlaceholderObserver.with_args(eps=2**-12)
        else:
            ctr = (HistogramObserver if config.observer == "histogram" else MinMaxObserver).with_args(eps=2**-12)
        if config.activation_dtype == "uint8":
            self.act = qw.QuantizationSpec(torch.uint8, ctr, 0, 255, torch.per_tensor_affine, is_dynamic=is_dynamic)
        elif config.symmetric_activations:
            self.act = qw.QuantizationSpec(torch.int8, ctr, -127, 127, torch.per_tensor_symmetric)
        else:
            self.act = qw.QuantizationSpec(torch.int8, ctr, -128, 127, torch.per_tensor_affine)
        self.weights = {axis: self._weight_spec(axis) for axis in (0, 1)}
        #: int32 bias: post-training static only (QAT folds batch norms into the bias; dynamic has none in ONNX)
        self.int32_bias = config.int32_bias and not is_qat and not is_dynamic
        #: a matmul is quantized only when its second operand is a constant (ORT's MatMulConstBOnly)
        self.matmul_const_b_only = resolve_matmul_const_b_only(config.matmul_const_b_only, is_dynamic)

    @property
    def fold_activations(self) -> bool:
        """Whether a relu / clip after an op is folded into its output range (not with a zero point of 0)."""
        return not self.config.symmetric_activations

    def _weight_spec(self, axis: int) -> qw.QuantizationSpec:
        config = self.config
        lo, hi = weight_range(config.reduce_range)
        ctr: Any
        if config.per_channel:
            if self.is_qat:
                # torch's fused moving-average fake-quantizer is per-channel on axis 0 only
                fake_quant = FusedMovingAvgObsFakeQuantize if axis == 0 else FakeQuantize
                ctr = fake_quant.with_args(eps=2**-12, observer=MovingAveragePerChannelMinMaxObserver, ch_axis=axis)
            else:
                ctr = PerChannelMinMaxObserver.with_args(eps=2**-12)
            return qw.QuantizationSpec(torch.int8, ctr, lo, hi, torch.per_channel_symmetric, ch_axis=axis)
        if self.is_qat:
            ctr = FusedMovingAvgObsFakeQuantize.with_args(eps=2**-12)
        else:
            ctr = MinMaxObserver.with_args(eps=2**-12)
        return qw.QuantizationSpec(torch.int8, ctr, lo, hi, torch.per_tensor_symmetric)

    def bias_spec(self, node: Node, x: Node, weight: Node) -> qw.DerivedQuantizationSpec:
        """int32, derived from the input edge's and the weight edge's observers."""
        per_channel = self.config.per_channel
        lo, hi = BIAS_RANGE
        return qw.DerivedQuantizationSpec(
            derived_from=[(x, node), (weight, node)],
            derive_qparams_fn=_bias_qparams,
            dtype=torch.int32,
            quant_min=lo,
            quant_max=hi,
            qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
            ch_axis=0 if per_channel else None,
        )

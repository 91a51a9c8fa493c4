"""The XNNPACK recipe's configs: :func:`get_symmetric_quantization_config` (ExecuTorch 1.5.1's
defaults) and the weight spec a transposed conv takes."""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

import quantweave as qw
from quantweave.authoring import activation_observer, weight_observer
from quantweave.observers import FakeQuantize, FusedMovingAvgObsFakeQuantize

from ._blockwise import check_blockwise, groupwise_weight_spec

__all__ = ["ACT_GRANULARITIES", "get_symmetric_quantization_config", "transpose_weight_spec"]

#: the dynamic activation granularities of :func:`get_symmetric_quantization_config`
ACT_GRANULARITIES = ("per_tensor", "per_token")


@functools.lru_cache(typed=True)
def get_symmetric_quantization_config(
    is_per_channel: bool = False,
    is_qat: bool = False,
    is_dynamic: bool = False,
    act_qmin: int = -128,
    act_qmax: int = 127,
    weight_qmin: int = -127,
    weight_qmax: int = 127,
    act_granularity: str = "per_tensor",
    weight_group_size: int | None = None,
) -> qw.QuantizationConfig:
    """The XNNPACK recipe: int8 per-tensor affine activations in ``[act_qmin, act_qmax]``
    (HistogramObserver; PlaceholderObserver when dynamic, whose config then quantizes no
    outputs), int8 symmetric weights in ``[weight_qmin, weight_qmax]`` (MinMaxObserver, or
    PerChannelMinMaxObserver along axis 0 with ``is_per_channel``), float bias; all with
    ``eps=2**-12``. ``weight_qmin=-8, weight_qmax=7`` gives 4-bit weights stored in int8.

    ``is_qat=True``: fake-quantizers for ``prepare_qat_pt2e`` (FusedMovingAvgObsFakeQuantize
    over moving-average min/max observers; dynamic activations: FakeQuantize over a
    MovingAverageMinMaxObserver with averaging constant 1).

    ``act_granularity`` (dynamic configs): ``"per_tensor"`` (default, ExecuTorch's
    ``XNNPACKQuantizer``: one (scale, zero point) per call, ``choose_qparams.tensor``) or
    ``"per_token"``: one per row over the last dimension, chosen at run time
    (``QuantizationSpec(per_token=True)``: ``choose_qparams_per_token_asymmetric``), which is
    what XNNPACK's dynamically quantized linear computes, so the lowered program matches the
    converted model. ``"per_token"`` needs ``is_dynamic=True``, ``is_qat=False`` and the full
    int8 activation range [-128, 127].

    ``weight_group_size`` (a multiple of 32): weights get a scale per output channel and run
    of that many input channels (XNNPACK's blockwise 4-bit linear; linears only, convs stay
    float). With ``weight_qmin=-8, weight_qmax=7``, ``is_dynamic=True`` and ``"per_token"``
    this is ExecuTorch's 8da4w (``get_8da4w_config``; see :mod:`._blockwise`)."""
    for name, value in (("is_per_channel", is_per_channel), ("is_qat", is_qat), ("is_dynamic", is_dynamic)):
        if not isinstance(value, bool):
            raise TypeError(f"get_symmetric_quantization_config: {name} must be a bool; got {value!r}")
    if act_granularity not in ACT_GRANULARITIES:
        raise ValueError(
            f"get_symmetric_quantization_config: act_granularity must be one of {', '.join(ACT_GRANULARITIES)}; "
            f"got {act_granularity!r}"
        )
    per_token = act_granularity == "per_token"
    if per_token and (not is_dynamic or is_qat or (act_qmin, act_qmax) != (-128, 127)):
        raise ValueError(
            "get_symmetric_quantization_config: act_granularity='per_token' chooses int8 qparams per token at run "
            "time: it needs is_dynamic=True, is_qat=False, act_qmin=-128, act_qmax=127; got "
            f"is_dynamic={is_dynamic}, is_qat={is_qat}, act_qmin={act_qmin}, act_qmax={act_qmax}"
        )
    if weight_group_size is not None:
        check_blockwise(weight_group_size, is_per_channel, is_qat, is_dynamic, weight_qmin, weight_qmax)
    act_ctr = activation_observer(is_qat=is_qat, is_dynamic=is_dynamic)
    weight_ctr = weight_observer(per_channel=is_per_channel, is_qat=is_qat)
    act = qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=act_qmin,
        quant_max=act_qmax,
        qscheme=torch.per_tensor_affine,
        is_dynamic=is_dynamic,
        observer_or_fake_quant_ctr=act_ctr,
        per_token=per_token,
    )
    weight = qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=weight_qmin,
        quant_max=weight_qmax,
        qscheme=torch.per_channel_symmetric if is_per_channel else torch.per_tensor_symmetric,
        ch_axis=0,
        observer_or_fake_quant_ctr=weight_ctr,
    )
    if weight_group_size is not None:
        weight = groupwise_weight_spec(weight_group_size, weight_qmin, weight_qmax)
    return qw.QuantizationConfig(act, None if is_dynamic else act, weight, None, is_qat)


def transpose_weight_spec(spec: qw.QuantizationSpec) -> qw.QuantizationSpec:
    """A transposed conv's weight is (in, out / groups, ...): its output channels are axis 1.

    torch's fused fake-quantizer supports per-channel only along axis 0, so a per-channel QAT
    weight spec built on it gets the unfused ``FakeQuantize`` with the same arguments."""
    spec = replace(spec, ch_axis=1)
    per_channel = spec.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine)
    partial = getattr(spec.observer_or_fake_quant_ctr, "p", None)
    if per_channel and getattr(partial, "func", None) is FusedMovingAvgObsFakeQuantize:
        keywords = dict(getattr(partial, "keywords", {}))
        spec = replace(spec, observer_or_fake_quant_ctr=FakeQuantize.with_args(**keywords))
    return spec

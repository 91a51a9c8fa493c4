"""x86's default config (the recipe's observers and ranges), and configs as a person reads them."""

from __future__ import annotations

import functools

import torch

import quantweave as qw
from quantweave.authoring import activation_observer, config_key, weight_observer
from quantweave.capabilities import tensor_quant_from_spec


@functools.lru_cache
def get_default_x86_inductor_quantization_config(
    is_qat: bool = False, is_dynamic: bool = False, reduce_range: bool = False
) -> qw.QuantizationConfig:
    """The x86 recipe: uint8 [0, 255] ([0, 127] with ``reduce_range``) per-tensor affine
    activations (HistogramObserver; PlaceholderObserver when dynamic), int8 [-128, 127]
    per-channel symmetric weights (PerChannelMinMaxObserver), float bias.

    ``is_qat=True``: the same ranges through fake-quantizers (FusedMovingAvgObsFakeQuantize,
    per-channel moving-average weights; dynamic activations: FakeQuantize over a
    MovingAverageMinMaxObserver with averaging constant 1), for ``prepare_qat_pt2e``."""
    for name, value in (("is_qat", is_qat), ("is_dynamic", is_dynamic), ("reduce_range", reduce_range)):
        if not isinstance(value, bool):
            raise TypeError(f"get_default_x86_inductor_quantization_config: {name} must be a bool; got {value!r}")
    act = qw.QuantizationSpec(
        dtype=torch.uint8,
        quant_min=0,
        quant_max=127 if reduce_range else 255,
        qscheme=torch.per_tensor_affine,
        is_dynamic=is_dynamic,
        observer_or_fake_quant_ctr=activation_observer(is_qat=is_qat, is_dynamic=is_dynamic),
    )
    weight = qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        observer_or_fake_quant_ctr=weight_observer(per_channel=True, is_qat=is_qat),
    )
    return qw.QuantizationConfig(act, act, weight, None, is_qat)


def is_dynamic(config: qw.QuantizationConfig) -> bool | None:
    act = config.input_activation
    return None if act is None else bool(act.is_dynamic)


def describe_config(config: qw.QuantizationConfig | None) -> str:
    """A config as a person reads it: the default recipe by its options, else its tensors."""
    if config is None:
        return "None"
    for qat in (False, True):
        for dynamic in (False, True):
            for reduce_range in (False, True):
                default = get_default_x86_inductor_quantization_config(
                    is_qat=qat, is_dynamic=dynamic, reduce_range=reduce_range
                )
                if config is default or config_key(config) == config_key(default):
                    mode = "qat" if qat else "dynamic" if dynamic else "static"
                    return f"default({mode}{', reduce_range' if reduce_range else ''})"
    act = tensor_quant_from_spec(config.input_activation)
    weight = tensor_quant_from_spec(config.weight)
    dynamic_text = ", dynamic" if is_dynamic(config) else ""
    qat_text = ", qat" if config.is_qat else ""
    return f"QuantizationConfig(activation={act}, weight={weight}{dynamic_text}{qat_text})"

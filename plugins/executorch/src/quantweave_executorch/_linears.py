"""The linears of the ``"llm"`` recipe: one ``XNNPACKQuantizer`` whose global config is the
recipe's linear config (8-bit per channel, 4-bit per channel, or 8da4w: 4-bit group-wise with
``linear_group_size``), and whose module-name / module-type configs keep chosen layers 8-bit,
4-bit or float (``linear_overrides``: ``{"lm_head": 8, "layers.0": None, MyBlock: 8}``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import quantweave as qw
from quantweave_xnnpack import ACT_GRANULARITIES, XNNPACKQuantizer, get_symmetric_quantization_config

__all__ = ["linear_config", "linear_quantizer", "weight_options"]

_WHERE = "ExecuTorchQuantizer"


def weight_options(linear_bits: Any, linear_group_size: Any, option: str = "linear_bits") -> dict[str, Any]:
    """The weight arguments of ``get_symmetric_quantization_config`` for ``linear_bits`` (8 or 4)
    and ``linear_group_size`` (4-bit only, a multiple of 32); a ValueError naming the option."""
    if isinstance(linear_bits, bool) or linear_bits not in (4, 8):
        raise ValueError(f"{_WHERE}: {option} must be 8, 4 or None; got {linear_bits!r}")
    if linear_group_size is not None and linear_bits != 4:
        raise ValueError(
            f"{_WHERE}: linear_group_size={linear_group_size!r} is for 4-bit linear weights (XNNPACK's blockwise "
            f"kernels); got {option}={linear_bits}"
        )
    if linear_bits == 8:
        return {}
    four: dict[str, Any] = {"weight_qmin": -8, "weight_qmax": 7}
    if linear_group_size is not None:
        if (
            isinstance(linear_group_size, bool)
            or not isinstance(linear_group_size, int)
            or linear_group_size < 1
            or linear_group_size % 32
        ):
            raise ValueError(
                f"{_WHERE}: linear_group_size must be a positive multiple of 32 (XNNPACK's blockwise 4-bit kernels: "
                f"32, 64, 128, 256, ...) or None; got {linear_group_size!r}"
            )
        four["weight_group_size"] = linear_group_size
    return four


def linear_config(bits: int, group_size: int | None, act_granularity: str, option: str) -> qw.QuantizationConfig:
    """The dynamic linear config for ``bits`` / ``group_size`` (group-wise takes activations per token)."""
    weights = weight_options(bits, group_size, option)
    granularity = "per_token" if "weight_group_size" in weights else act_granularity
    return get_symmetric_quantization_config(
        is_per_channel=True, is_dynamic=True, act_granularity=granularity, **weights
    )


def linear_quantizer(
    linear_bits: int,
    linear_group_size: int | None,
    act_granularity: str,
    overrides: Mapping[Any, int | None] | None,
) -> XNNPACKQuantizer:
    """The recipe's XNNPACK member (see the module docstring)."""
    if act_granularity not in ACT_GRANULARITIES:
        raise ValueError(
            f"{_WHERE}: act_granularity must be one of {', '.join(ACT_GRANULARITIES)}; got {act_granularity!r}"
        )
    if linear_group_size is not None and act_granularity != "per_token":
        raise ValueError(
            f"{_WHERE}: linear_group_size (8da4w) quantizes activations per token, as XNNPACK's blockwise kernels "
            f"do; got act_granularity={act_granularity!r}"
        )
    quantizer = XNNPACKQuantizer().set_global(
        linear_config(linear_bits, linear_group_size, act_granularity, "linear_bits")
    )
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"{_WHERE}: linear_overrides must map module names or types to 8, 4 or None; got {overrides!r}")
    for key, bits in (overrides or {}).items():
        option = f"linear_overrides[{key!r}]"
        config = (
            None
            if bits is None
            else linear_config(bits, linear_group_size if bits == 4 else None, act_granularity, option)
        )
        if isinstance(key, str):
            quantizer.set_module_name(key, config)
        elif isinstance(key, type) and issubclass(key, torch.nn.Module):
            quantizer.set_module_type(key, config)
        else:
            raise TypeError(f"{_WHERE}: linear_overrides keys are module names or nn.Module types; got {key!r}")
    quantizer.plugin = "xnnpack"
    return quantizer

"""8da4w: linears with int8 activations quantized per token at run time and int4 group-wise
symmetric weights, the form ExecuTorch 1.5.1's XNNPACK partitioner lowers to XNNPACK's
blockwise 4-bit kernels (``qd8_f32_qb4w``).

What the partitioner takes (read off ``executorch/backends/xnnpack``: ``quant_params.py``,
``utils/quant_utils.py``, ``operators/node_visitor.py``): a weight behind
``quantized_decomposed.dequantize_per_channel_group`` (or torchao's ``dequantize_affine`` with
``block_size=(1, group)``) whose values lie in [-8, 7] in int8, scales of shape
``(out_features, in_features // group)``, ``group_size`` a multiple of 32 dividing
``in_features``; the activation behind a dynamic ``choose_qparams`` -> ``quantize`` ->
``dequantize``. It packs the values two per byte into the program (``convert_to_qc4w``) and
stores the scales as bfloat16.

The converted model already has that form (``QuantizationSpec(group_size=...)`` converts to
``quantize_per_channel_group`` / ``dequantize_per_channel_group``): nothing of torchao is
needed. The weight observer here rounds every group's scale *up* to a bfloat16 value, so the
scales XNNPACK stores are the ones the converted model computed its integers with, and the
program matches the converted model (rounding up never clips an element that fitted the range;
the step grows by at most 2**-8, 0.4 %).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

import quantweave as qw
from quantweave.authoring import module_paths
from quantweave.observers import PerGroupMinMaxObserver
from quantweave.plugin_api import ANNOTATION_KEY, SKIP_REASON_KEY

from ._graph import weight_shape

__all__ = [
    "BF16ScalePerGroupMinMaxObserver",
    "GROUPWISE_NOT_LINEAR",
    "check_blockwise",
    "check_group_size",
    "check_linear_groups",
    "get_8da4w_config",
    "groupwise_reason",
    "groupwise_weight_spec",
    "is_groupwise",
    "linear_weights",
    "linear_weights_text",
    "round_up_to_bf16",
    "weight_form",
]

#: why a conv stays float under a group-wise config (the report prefixes the matcher's name)
GROUPWISE_NOT_LINEAR = "group-wise (blockwise 4-bit) weights are for linear only; XNNPACK has no blockwise conv"

#: XNNPACK's blockwise kernels take groups of a multiple of this many elements
GROUP_MULTIPLE = 32


#: scales from this many on are rounded in integer arithmetic (below, the float ops are as fast)
_INTEGER_PATH_MIN = 4096


def round_up_to_bf16(scale: torch.Tensor, *, in_place: bool = False) -> torch.Tensor:
    """``scale`` (positive, finite) rounded up to bfloat16 values, returned as float32.
    ``in_place``: a float32 ``scale`` no one else holds (just computed) may be rounded in its own
    storage and returned (no new tensor of its size)."""
    in_place = in_place and scale.dtype == torch.float32 and scale.is_contiguous()
    scale = scale.detach().to(torch.float32)
    if scale.numel() >= _INTEGER_PATH_MIN and scale.device.type == "cpu":
        low, high = torch.aminmax(scale.reshape(-1))
        if bool(low > 0) and bool(high < float("inf")):
            # positive finite float32: a bfloat16 value is a float32 whose low 16 bits are 0, and
            # the order of such floats is the order of their bits: the smallest bfloat16 value
            # >= scale clears the low bits after adding 0xFFFF (the values of the general path
            # below, in two integer passes instead of seven)
            bits = scale.contiguous().view(torch.int32)
            if in_place:
                return bits.add_(0xFFFF).bitwise_and_(-0x10000).view(torch.float32)
            return torch.add(bits, 0xFFFF).bitwise_and_(-0x10000).view(torch.float32)  # one new tensor
    rounded = scale.to(torch.bfloat16)
    below = rounded.to(torch.float32) < scale
    rounded = torch.where(below, torch.nextafter(rounded, torch.full_like(rounded, float("inf"))), rounded)
    return rounded.to(torch.float32)


class BF16ScalePerGroupMinMaxObserver(PerGroupMinMaxObserver):
    """``PerGroupMinMaxObserver`` (symmetric) whose scales are bfloat16 values, rounded up: the
    scales XNNPACK's blockwise kernels store (see the module docstring)."""

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        scale, zero_point = super().calculate_qparams()
        # PerGroupMinMaxObserver's calculation returns a scale tensor of its own: rounded in place
        # (a class between may return one it holds: rounded into a new tensor)
        return round_up_to_bf16(scale, in_place=type(self) is BF16ScalePerGroupMinMaxObserver), zero_point

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scales bfloat16"


def check_group_size(group_size: Any, where: str, option: str = "weight_group_size") -> int:
    """``group_size`` if it is a positive multiple of 32, else a ValueError naming ``option``."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or group_size % 32:
        raise ValueError(
            f"{where}: {option} must be a positive multiple of {GROUP_MULTIPLE} (XNNPACK's blockwise 4-bit kernels: "
            f"32, 64, 128, 256, ...); got {group_size!r}"
        )
    return group_size


def groupwise_weight_spec(group_size: int, weight_qmin: int, weight_qmax: int) -> qw.QuantizationSpec:
    """int8 storage of values in [weight_qmin, weight_qmax], a symmetric scale per output
    channel and run of ``group_size`` input channels, scales rounded up to bfloat16 values."""
    return qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=weight_qmin,
        quant_max=weight_qmax,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        group_size=group_size,
        observer_or_fake_quant_ctr=BF16ScalePerGroupMinMaxObserver.with_args(eps=2**-12),
    )


def check_blockwise(
    group_size: Any, is_per_channel: bool, is_qat: bool, is_dynamic: bool, weight_qmin: int, weight_qmax: int
) -> None:
    """What ``get_symmetric_quantization_config(weight_group_size=...)`` needs: a multiple of 32,
    per-channel, post-training, dynamic activations and 4-bit weights (XNNPACK's blockwise
    kernels are ``qd8_f32_qb4w`` only); a ValueError naming the option otherwise."""
    where = "get_symmetric_quantization_config"
    check_group_size(group_size, where)
    wanted = {"is_per_channel": True, "is_qat": False, "is_dynamic": True, "weight_qmin": -8, "weight_qmax": 7}
    got = {
        "is_per_channel": is_per_channel,
        "is_qat": is_qat,
        "is_dynamic": is_dynamic,
        "weight_qmin": weight_qmin,
        "weight_qmax": weight_qmax,
    }
    wrong = [f"{k}={got[k]!r}" for k in wanted if got[k] != wanted[k]]
    if wrong:
        raise ValueError(
            f"{where}: weight_group_size={group_size} is XNNPACK's blockwise 4-bit linear (dynamic int8 activations, "
            "int4 weights): it needs is_per_channel=True, is_qat=False, is_dynamic=True, weight_qmin=-8, "
            f"weight_qmax=7; got {', '.join(wrong)}"
        )


def get_8da4w_config(group_size: int = 32) -> qw.QuantizationConfig:
    """ExecuTorch's 8da4w for linears: int8 activations quantized per token at run time, int4
    symmetric weights (values in [-8, 7] stored in int8) with a scale per output channel and
    run of ``group_size`` (a multiple of 32) input channels, scales bfloat16 values. Lowered by
    ``to_executorch`` to XNNPACK's blockwise 4-bit kernels, the weights packed two per byte."""
    from ._config import get_symmetric_quantization_config

    check_group_size(group_size, "get_8da4w_config", "group_size")
    return get_symmetric_quantization_config(
        is_per_channel=True,
        is_dynamic=True,
        act_granularity="per_token",
        weight_qmin=-8,
        weight_qmax=7,
        weight_group_size=group_size,
    )


def _layer(node: Node) -> str:
    paths = module_paths(node)
    return f"layer {paths[-1]!r} (node {node.name!r})" if paths else f"node {node.name!r}"


def check_linear_groups(linear: Node, config: qw.QuantizationConfig) -> None:
    """Raise ``quantweave.AnnotationError`` naming the layer when ``config`` is group-wise and
    the linear's ``in_features`` does not split into its groups (exclude the layer by name or
    type, or keep it 8-bit, or pick a group size that divides it)."""
    spec = config.weight
    group_size = getattr(spec, "group_size", None)
    if group_size is None:
        return
    shape = weight_shape(linear.args[1])
    if shape is None:
        return
    if len(shape) != 2 or shape[1] % group_size:
        raise qw.AnnotationError(
            f"XNNPACKQuantizer: {_layer(linear)}: weight_group_size={group_size} (ExecuTorchQuantizer's "
            f"linear_group_size) must divide in_features; got a "
            f"weight of shape {tuple(shape)} (in_features {shape[-1]}). Choose a group size that divides it, or "
            "configure the layer apart (set_module_name / set_module_type with an 8-bit config, or None to leave "
            "it float)"
        )


def is_groupwise(config: qw.QuantizationConfig) -> bool:
    return getattr(config.weight, "group_size", None) is not None


def groupwise_reason(node: Node, config: qw.QuantizationConfig) -> str | None:
    """Under a group-wise config: raise for a linear whose in_features its groups do not
    divide (:func:`check_linear_groups`), return why any other weighted op stays float."""
    if not is_groupwise(config):
        return None
    if node.target is not torch.ops.aten.linear.default:
        return GROUPWISE_NOT_LINEAR
    check_linear_groups(node, config)
    return None


def weight_form(spec: Any) -> str:
    """A weight spec in words: ``"int4 group-wise (32)"``, ``"int8 per-channel"``..."""
    if spec is None:
        return "float"
    lo, hi = getattr(spec, "quant_min", None), getattr(spec, "quant_max", None)
    bits = "int4" if (lo, hi) == (-8, 7) else str(getattr(spec, "dtype", "")).removeprefix("torch.")
    group = getattr(spec, "group_size", None)
    if group is not None:
        return f"{bits} group-wise ({group})"
    per_channel = getattr(spec, "qscheme", None) in (torch.per_channel_symmetric, torch.per_channel_affine)
    return f"{bits} {'per-channel' if per_channel else 'per-tensor'}"


def _unobserved(node: Any) -> Any:
    """The node an observer / fake-quantizer (a ``call_module`` of a prepared model) observes."""
    while isinstance(node, Node) and node.op == "call_module" and node.args:
        node = node.args[0]
    return node


def linear_weights(model: Any) -> list[tuple[str, str, str]]:
    """Which linear got what, for a prepared (or annotated) model: one ``(node, layer, weight)``
    per ``aten.linear``, ``weight`` as :func:`weight_form` says (``"float: <why>"`` for a linear
    left float, with the reason the quantizer recorded)."""
    rows = []
    for node in model.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.linear.default:
            continue
        paths = module_paths(node)
        annotation = node.meta.get(ANNOTATION_KEY)
        spec = None if annotation is None else annotation.input_qspec_map.get(_unobserved(node.args[1]))
        form = weight_form(spec)
        if spec is None:
            form = f"float: {node.meta.get(SKIP_REASON_KEY) or 'not annotated'}"
        rows.append((node.name, paths[-1] if paths else "", form))
    return rows


def linear_weights_text(model: Any) -> str:
    """:func:`linear_weights` as aligned text, one line per linear."""
    rows = [("node", "layer", "weight"), *linear_weights(model)]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)

"""What the XNNPACK quantizer declares: cheap to import (the plugin hook needs only this)."""

from __future__ import annotations

from quantweave.plugin_api import FLOAT, Capability, Mode, Quant, TensorQuant

__all__ = ["DYNAMIC_PATTERNS", "QAT_ONLY_PATTERNS", "STATIC_PATTERNS", "declared_capabilities"]

#: ops that take their input's qparams: cat and adaptive_avg_pool2d as patterns of their own,
#: the rest only where a producer's output is quantized (by any quantizer: a cat, a mean, a
#: pooling... of its own, or another quantizer's op with output qparams)
_SHARES_INPUT = ("cat", "adaptive_avg_pool2d")
_PROPAGATED = (
    "max_pool2d",
    "mean",
    "permute",
    "transpose",
    "view",
    "reshape",
    "squeeze",
    "slice",
    "flatten",
    "dropout",
    "relu",
    "hardtanh",
    "relu6",
)
#: Patterns a static (post-training) config annotates. relu / hardtanh / relu6 after a conv
#: share the conv's output qparams (conv2d_hardtanh, conv2d_relu6); the shape and reduction
#: ops, and relu / hardtanh / relu6 anywhere else, share their quantized input's qparams.
STATIC_PATTERNS = (
    "conv1d",
    "conv1d_relu",
    "conv2d",
    "conv2d_relu",
    "conv2d_hardtanh",
    "conv2d_relu6",
    "conv_transpose2d",
    "conv_transpose2d_relu",
    "linear",
    "linear_relu",
    "add",
    "add_relu",
    "mul",
    "mul_relu",
    *_SHARES_INPUT,
    *_PROPAGATED,
)
#: Patterns a dynamic config annotates (conv only with a 4-D, non-depthwise weight).
DYNAMIC_PATTERNS = ("conv2d", "conv_transpose2d", "linear")
#: conv / conv_transpose + batch norm (+ relu): annotated first by a QAT config (an activation
#: after the batch norm shares its qparams); prepare_qat_pt2e simulates the fold and
#: convert_pt2e folds the batch norm (a transposed conv with one group).
QAT_ONLY_PATTERNS = (
    "conv2d_bn",
    "conv2d_bn_relu",
    "conv2d_bn_hardtanh",
    "conv2d_bn_relu6",
    "conv_transpose2d_bn",
    "conv_transpose2d_bn_relu",
)
_WEIGHTED = ("conv", "linear")
#: hardtanh / relu6 after a conv (or its batch norm) share the conv's quantized output: two
#: quantized steps, not one fused unit
_SPLIT = ("conv2d_hardtanh", "conv2d_relu6", "conv2d_bn_hardtanh", "conv2d_bn_relu6")


def declared_capabilities(
    is_per_channel: bool = False,
    is_qat: bool = False,
    is_dynamic: bool = False,
    act_qmin: int = -128,
    act_qmax: int = 127,
    weight_qmin: int = -127,
    weight_qmax: int = 127,
    act_granularity: str = "per_tensor",
) -> tuple[Capability, ...]:
    """What an ``XNNPACKQuantizer`` whose global config is
    ``get_symmetric_quantization_config(...)`` with these arguments annotates
    (conformance-tested): int8 per-tensor affine activations, int8 symmetric weights
    (per-tensor, or per-channel with ``is_per_channel``: output channels, axis 0 for conv
    and linear, axis 1 for conv_transpose), float bias; static and QAT outputs get their own
    qparams, dynamic outputs stay float. Dynamic conv applies only to 4-D, non-depthwise
    weights (a note on the capability; the kit probes a 4-D conv). ``act_granularity=
    "per_token"`` (dynamic only): activations quantized per token at run time."""
    act = TensorQuant("int8", act_qmin, act_qmax, act_granularity, symmetric=False)

    def weight(pattern: str) -> TensorQuant:
        if not is_per_channel:
            return TensorQuant("int8", weight_qmin, weight_qmax, "per_tensor", symmetric=True)
        axis = 1 if pattern.startswith("conv_transpose") else 0
        return TensorQuant("int8", weight_qmin, weight_qmax, "per_channel", symmetric=True, ch_axis=axis)

    patterns: tuple[str, ...]
    if is_dynamic:
        mode = Mode.DYNAMIC
        patterns = DYNAMIC_PATTERNS
    elif is_qat:
        mode = Mode.QAT
        patterns = QAT_ONLY_PATTERNS + STATIC_PATTERNS
    else:
        mode = Mode.STATIC
        patterns = STATIC_PATTERNS

    def capability(pattern: str) -> Capability:
        weighted = pattern.startswith(_WEIGHTED)
        if pattern in _SHARES_INPUT or pattern in _PROPAGATED:
            output = Quant.shared(0)
        else:
            output = FLOAT if mode is Mode.DYNAMIC else Quant.quantized(act)
        multi_op = "_relu" in pattern or "_bn" in pattern or pattern in _SPLIT
        return Capability(
            pattern,
            mode,
            act,
            weight(pattern) if weighted else None,
            quantizer="xnnpack",
            output=output,
            bias=FLOAT if weighted else None,
            fused=(pattern not in _SPLIT) if multi_op else None,
            input_from="any" if pattern in _PROPAGATED else None,
            notes="dynamic: 4-D non-depthwise weights only" if mode is Mode.DYNAMIC and pattern != "linear" else "",
        )

    return tuple(capability(p) for p in patterns)

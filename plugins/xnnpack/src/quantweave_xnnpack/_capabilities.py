"""What the XNNPACK quantizer declares: cheap to import (the plugin hook needs only this)."""

from __future__ import annotations

from quantweave.plugin_api import Capability, Mode, TensorQuant

__all__ = ["DYNAMIC_PATTERNS", "QAT_ONLY_PATTERNS", "STATIC_PATTERNS", "declared_capabilities"]

#: Patterns a static (post-training) config annotates. relu / hardtanh / relu6 after a conv
#: share the conv's output qparams (conv2d_hardtanh, conv2d_relu6); the shape and reduction
#: ops share their quantized input's qparams.
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
    "cat",
    "adaptive_avg_pool2d",
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
)
#: Patterns a dynamic config annotates (conv only with a 4-D, non-depthwise weight).
DYNAMIC_PATTERNS = ("conv2d", "conv_transpose2d", "linear")
#: conv + batch norm (+ relu): annotated first by a QAT config (an activation after the batch
#: norm shares its qparams). conv_transpose + batch norm is not a pattern: quantweave's QAT
#: does not fold a batch norm into a transposed conv, so the transposed conv is quantized
#: alone and the batch norm stays float.
QAT_ONLY_PATTERNS = ("conv2d_bn", "conv2d_bn_relu", "conv2d_bn_hardtanh", "conv2d_bn_relu6")
_WEIGHTED = ("conv", "linear")


def declared_capabilities(
    is_per_channel: bool = False,
    is_qat: bool = False,
    is_dynamic: bool = False,
    act_qmin: int = -128,
    act_qmax: int = 127,
    weight_qmin: int = -127,
    weight_qmax: int = 127,
) -> tuple[Capability, ...]:
    """What an ``XNNPACKQuantizer`` whose global config is
    ``get_symmetric_quantization_config(...)`` with these arguments annotates
    (conformance-tested): int8 per-tensor affine activations, int8 symmetric weights
    (per-tensor, or per-channel with ``is_per_channel``)."""
    act = TensorQuant("int8", act_qmin, act_qmax, "per_tensor", symmetric=False)
    weight = TensorQuant(
        "int8", weight_qmin, weight_qmax, "per_channel" if is_per_channel else "per_tensor", symmetric=True
    )
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
    return tuple(
        Capability(p, mode, act, weight if p.startswith(_WEIGHTED) else None, quantizer="xnnpack") for p in patterns
    )

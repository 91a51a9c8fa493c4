"""What the x86 quantizer declares: cheap to import (the plugin hook needs only this)."""

from __future__ import annotations

from quantweave.plugin_api import FLOAT, Capability, Mode, Quant, TensorQuant

__all__ = ["declared_capabilities"]

_STATIC_PATTERNS = (
    "conv1d",
    "conv1d_relu",
    "conv2d",
    "conv2d_relu",
    "conv2d_hardtanh",
    "conv2d_relu6",
    "conv2d_hardswish",
    "conv2d_silu",
    "conv2d_add",
    "conv2d_add_relu",
    "linear",
    "linear_relu",
    "linear_leaky_relu",
    "linear_tanh",
    "linear_gelu",
    "linear_add",
    "linear_add_relu",
    "mul",
    "cat",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "flatten",
)
# QAT annotates conv2d + batch norm (+ add (+ relu) / activation) as one pattern, before the rest
_QAT_BN_PATTERNS = (
    "conv2d_bn",
    "conv2d_bn_relu",
    "conv2d_bn_hardtanh",
    "conv2d_bn_relu6",
    "conv2d_bn_hardswish",
    "conv2d_bn_silu",
    "conv2d_bn_add",
    "conv2d_bn_add_relu",
)
_WEIGHTED = ("conv", "linear")


# ops that take their input's qparams (quantized only when their input is)
_SHARES_INPUT = ("cat", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "flatten")


def declared_capabilities(
    is_dynamic: bool = False, reduce_range: bool = False, enable_matmul: bool = False, is_qat: bool = False
) -> tuple[Capability, ...]:
    """What an ``X86InductorQuantizer`` with these options annotates (conformance-tested).

    Conv and linear quantize their inputs (uint8 per-tensor activations, int8 per-channel
    symmetric weights on axis 0, float bias) and leave their output float for the next
    quantized op to quantize; a fused pattern (conv + relu, linear + add, ...) is one unit
    with no quantize/dequantize inside. Pooling, cat and flatten share their input's
    qparams, and are quantized only after one of x86's own quantized patterns.
    ``is_qat`` declares the QAT mode: the conv + batch norm patterns, whose last op
    fake-quantizes its own output, then everything the post-training recipe annotates."""
    act = TensorQuant("uint8", 0, 127 if reduce_range else 255, "per_tensor", symmetric=False)
    weight = TensorQuant("int8", -128, 127, "per_channel", symmetric=True, ch_axis=0)
    patterns: tuple[str, ...]
    if is_qat:
        mode = Mode.QAT
        patterns = _QAT_BN_PATTERNS + _STATIC_PATTERNS
    else:
        mode = Mode.DYNAMIC if is_dynamic else Mode.STATIC
        patterns = _STATIC_PATTERNS
    patterns += ("matmul",) if enable_matmul else ()

    def capability(pattern: str) -> Capability:
        weighted = pattern.startswith(_WEIGHTED)
        if pattern in _SHARES_INPUT:
            output = Quant.shared(0)
        elif pattern in _QAT_BN_PATTERNS:
            output = Quant.quantized(act)
        else:
            output = FLOAT
        return Capability(
            pattern,
            mode,
            act,
            weight if weighted else None,
            quantizer="x86",
            output=output,
            bias=FLOAT if weighted else None,
            fused=True if "_" in pattern and pattern not in _SHARES_INPUT else None,
            input_from="own" if pattern in _SHARES_INPUT else None,
        )

    return tuple(capability(p) for p in patterns)

"""What the ONNX Runtime quantizer declares: cheap to import (the plugin hook needs only this)."""

from __future__ import annotations

from typing import Any

from quantweave.plugin_api import FLOAT, Capability, Mode, Quant, TensorQuant

__all__ = [
    "AVERAGING",
    "BIAS_RANGE",
    "FUSED_ACTIVATION",
    "OWN_OUTPUT",
    "SHARED_OUTPUT",
    "CONTRIBUTED",
    "CONTRIBUTED_OPS",
    "DYNAMIC_PATTERNS",
    "QAT_BN_PATTERNS",
    "SHARED_MULTI",
    "STATIC_PATTERNS",
    "UNARY_OWN",
    "WEIGHTED",
    "activation_quant",
    "bias_quant",
    "declared_capabilities",
    "resolve_matmul_const_b_only",
    "weight_quant",
    "weight_range",
]

#: weighted ops, alone or with an activation ORT folds into their output's quantization range
#: (ReluQuantFusion / ClipQuantFusion drop the relu / clip in front of the QuantizeLinear)
WEIGHTED = (
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
)
#: two-input ops with their own output qparams (QLinearAdd, QLinearMul, QLinearMatMul)
OWN_OUTPUT = ("add", "add_relu", "mul", "mul_relu", "matmul")
#: ops ORT runs on int8 data with the same qparams in and out (it drops their DQ / Q pair):
#: quantized where their input is quantized (cat always: ORT's Concat shares one range)
SHARED_OUTPUT = ("cat", "max_pool2d", "flatten", "permute", "transpose", "view", "reshape", "squeeze", "dropout")
#: averaging ops: quantized where their input is, with their own output qparams
#: (QLinearAveragePool / QLinearGlobalAveragePool)
AVERAGING = ("avg_pool2d", "adaptive_avg_pool2d")
#: one-input ops with their own output qparams whose input ORT quantizes wherever it comes from
#: (QLinearSigmoid, QLinearSoftmax)
UNARY_OWN = ("sigmoid", "softmax")
#: ops this plugin adds to the vocabulary (``quantweave_patterns``), sharing their input's
#: qparams where it is quantized: split (its outputs, getitem nodes, are not annotated as the
#: split's output: every quantized consumer quantizes them with the split input's range, which
#: is what ORT's Split unit needs) and resize (nearest / bilinear upsampling: ORT drops the
#: DQ / Q pair around Resize)
SHARED_MULTI = ("split",)
#: the contributed patterns and their aten ops (``_patterns`` contributes them with these ops;
#: every capability names its ops, core patterns' from the core vocabulary)
CONTRIBUTED_OPS: dict[str, tuple[str, ...]] = {
    "split": ("aten.split.Tensor",),
    "resize": ("aten.upsample_nearest2d.vec",),
    "resize_bilinear": ("aten.upsample_bilinear2d.vec",),
}
CONTRIBUTED = tuple(CONTRIBUTED_OPS)
STATIC_PATTERNS = WEIGHTED + OWN_OUTPUT + SHARED_OUTPUT + AVERAGING + UNARY_OWN + CONTRIBUTED
#: QAT: conv2d + batch norm (+ relu / clip) first, batch norm folded by convert
QAT_BN_PATTERNS = ("conv2d_bn", "conv2d_bn_relu", "conv2d_bn_hardtanh", "conv2d_bn_relu6")
#: dynamic (ORT's quantize_dynamic: DynamicQuantizeLinear -> MatMulInteger): the activation
#: inputs of linear / matmul get uint8 qparams chosen at run time, outputs stay float
DYNAMIC_PATTERNS = ("linear", "matmul")
#: patterns whose ops form one quantized unit (no quantize / dequantize between them)
FUSED_ACTIVATION = tuple(
    p for p in STATIC_PATTERNS + QAT_BN_PATTERNS if p.endswith(("_relu", "_relu6", "_hardtanh", "_bn"))
)


def activation_quant(activation_dtype: str = "uint8", symmetric: bool = False) -> TensorQuant:
    """uint8 [0, 255] (ORT's QUInt8 default) or int8 [-128, 127] (QInt8), both affine: a relu's
    output then has the lowest value as zero point, which is what lets ORT drop the relu.
    ``symmetric``: int8 [-127, 127] with zero point 0 (QInt8 with ORT's ``ActivationSymmetric``)."""
    if activation_dtype == "int8" and symmetric:
        return TensorQuant("int8", -127, 127, "per_tensor", symmetric=True)
    if activation_dtype == "int8":
        return TensorQuant("int8", -128, 127, "per_tensor", symmetric=False)
    return TensorQuant("uint8", 0, 255, "per_tensor", symmetric=False)


def weight_range(reduce_range: bool = False) -> tuple[int, int]:
    """ORT's symmetric int8 weight range: [-127, 127]; [-64, 64] (7 bits, ORT's ``reduce_range``)
    for CPUs without VNNI, whose u8 x s8 kernels saturate 16-bit pair sums of full-range weights."""
    return (-64, 64) if reduce_range else (-127, 127)


#: int32 bias (ORT's quantize_static: scale = input scale x weight scale, zero point 0)
BIAS_RANGE = (-(2**31), 2**31 - 1)


def bias_quant(per_channel: bool = True) -> TensorQuant:
    """int32 symmetric, per output channel when the weights are (axis 0 of the bias)."""
    lo, hi = BIAS_RANGE
    if not per_channel:
        return TensorQuant("int32", lo, hi, "per_tensor", symmetric=True)
    return TensorQuant("int32", lo, hi, "per_channel", symmetric=True, ch_axis=0)


def weight_quant(pattern: str, per_channel: bool = True, reduce_range: bool = False) -> TensorQuant:
    """int8 symmetric; per output channel: axis 0, axis 1 for a transposed conv."""
    lo, hi = weight_range(reduce_range)
    if not per_channel:
        return TensorQuant("int8", lo, hi, "per_tensor", symmetric=True)
    axis = 1 if pattern.startswith("conv_transpose") else 0
    return TensorQuant("int8", lo, hi, "per_channel", symmetric=True, ch_axis=axis)


def resolve_matmul_const_b_only(value: bool | None, is_dynamic: bool) -> bool:
    """ORT's default for ``MatMulConstBOnly`` where ``value`` is None: True for ``quantize_dynamic``,
    False for ``quantize_static``."""
    return is_dynamic if value is None else value


def declared_capabilities(
    activation_dtype: str = "uint8",
    per_channel: bool = True,
    reduce_range: bool = False,
    is_dynamic: bool = False,
    is_qat: bool = False,
    symmetric_activations: bool = False,
    int32_bias: bool = True,
    matmul_const_b_only: bool | None = None,
) -> tuple[Capability, ...]:
    """What an ``ORTQuantizer`` with these options annotates (conformance-tested).

    Static: conv / transposed conv / linear quantize their input, their weight and their
    output, so ONNX Runtime finds DQ -> op -> Q node units; their bias is int32 (scale input
    scale x weight scale, zero point 0, as ``quantize_static`` writes it; ``int32_bias=False``,
    QAT and dynamic: float; a linear on input of more than 2 dimensions, exported as MatMul +
    Add, keeps it float as ORT does); an activation after
    them is folded into the output's range (no Q / DQ between them). add / mul / matmul
    quantize both inputs and their own output, sigmoid / softmax their input and their own
    output; cat, split, resize, max pooling and the shape ops share their input's qparams;
    average pooling gets its own. ``is_qat``: the same through fake-quantizers, plus conv2d +
    batch norm (+ relu / clip), whose last op quantizes its output. ``is_dynamic``: linear and
    matmul with uint8 activations chosen at run time (ORT's ``MatMulInteger`` path), float
    outputs. ``matmul_const_b_only`` (None: True in the dynamic mode, as ``quantize_dynamic``;
    False otherwise): the matmul of two activations is not offered (it stays float).
    ``symmetric_activations`` (int8): no activation is folded into an output range (a
    zero point of 0 does not clamp where relu does, so ORT keeps the relu): the fused patterns
    are not offered, the op before the activation quantizes its own output."""
    act = activation_quant(activation_dtype, symmetric_activations)
    mode: Mode
    patterns: tuple[str, ...]
    if is_dynamic:
        mode, patterns = Mode.DYNAMIC, DYNAMIC_PATTERNS
    elif is_qat:
        mode, patterns = Mode.QAT, QAT_BN_PATTERNS + STATIC_PATTERNS
    else:
        mode, patterns = Mode.STATIC, STATIC_PATTERNS
    if symmetric_activations:
        patterns = tuple(p for p in patterns if p not in FUSED_ACTIVATION or p == "conv2d_bn")
    if resolve_matmul_const_b_only(matmul_const_b_only, is_dynamic):
        # only x @ W is quantized; its constant operand as the recipe has always quantized a
        # matmul's second input: with the activations' spec (so the weight is declared that way)
        patterns = tuple("matmul_weight" if p == "matmul" else p for p in patterns)

    int32 = int32_bias and not is_dynamic and not is_qat

    def output_of(pattern: str) -> Any:
        if is_dynamic or pattern in SHARED_MULTI:  # split: its consumers quantize each output
            return FLOAT
        if pattern in SHARED_OUTPUT + CONTRIBUTED:
            return Quant.shared(0)
        return Quant.quantized(act)

    def capability(pattern: str) -> Capability:
        weighted = pattern in WEIGHTED + QAT_BN_PATTERNS
        if pattern == "matmul_weight":
            return Capability(pattern, mode, act, act, quantizer="onnxruntime", output=output_of(pattern))
        output = output_of(pattern)
        shares_input = pattern in SHARED_OUTPUT + AVERAGING + CONTRIBUTED and pattern != "cat"
        return Capability(
            pattern,
            mode,
            act,
            weight_quant(pattern, per_channel, reduce_range) if weighted else None,
            quantizer="onnxruntime",
            ops=CONTRIBUTED_OPS.get(pattern, ()),
            output=output,
            bias=(Quant.quantized(bias_quant(per_channel)) if int32 and pattern in WEIGHTED else FLOAT)
            if weighted
            else None,
            fused=True if pattern in FUSED_ACTIVATION and not is_dynamic else None,
            input_from="any" if shares_input else None,
        )

    return tuple(capability(p) for p in patterns)

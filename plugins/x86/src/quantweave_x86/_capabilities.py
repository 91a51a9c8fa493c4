"""x86's rule table: one row per pattern, declaring it, naming the step that annotates it and
the reason a node of it stays float. ``declared_capabilities`` (what the plugin hook and the
quantizer declare), the annotation order and the report's float reasons all read these rows."""

from __future__ import annotations

from collections.abc import Callable

from torch.fx import Node

from quantweave.authoring import Rule, RuleTable
from quantweave.plugin_api import Capability, Mode, TensorQuant

from . import _annotate as step
from ._reasons import why_add, why_fused, why_propagated, why_two_inputs, why_weight_matmul, why_weighted

__all__ = ["TABLE", "declared_capabilities"]

_ALL = (Mode.STATIC, Mode.DYNAMIC, Mode.QAT)
#: patterns whose weight is stored [in, out] (a linear written as a matrix product)
_IN_OUT_WEIGHTS = frozenset(("addmm", "mm", "matmul_weight"))


def _either(*whys: Callable[[Node], str | None]) -> Callable[[Node], str | None]:
    def why(node: Node) -> str | None:
        return next((r for r in (w(node) for w in whys) if r is not None), None)

    return why


_CONV_ACT = _either(why_weighted, why_fused)
_CONV_ADD = _either(why_weighted, why_add, why_fused)
_BN = _either(why_weighted, why_fused, why_add)


def _fused(pattern: str, annotate: Callable[..., None], why: Callable[[Node], str | None], **kw: object) -> Rule:
    return Rule(pattern, annotate, why, modes=_ALL, weighted=True, fused=True, **kw)  # type: ignore[arg-type]


def _qat_bn(pattern: str) -> Rule:
    # QAT annotates conv2d + batch norm (+ add (+ relu) / activation) as one pattern whose last
    # node fake-quantizes its own output, before the rest
    return Rule(pattern, step.conv_bn, _BN, modes=(Mode.QAT,), weighted=True, output="quantized", fused=True)


def _shares_input(pattern: str) -> Rule:
    # ops that take their input's qparams (quantized only when their input is)
    return Rule(pattern, step.propagate, why_propagated, modes=_ALL, output="shared", input_from="own")


TABLE = RuleTable(
    "x86",
    [
        *(
            _qat_bn(p)
            for p in (
                "conv2d_bn",
                "conv2d_bn_relu",
                "conv2d_bn_hardtanh",
                "conv2d_bn_relu6",
                "conv2d_bn_hardswish",
                "conv2d_bn_silu",
                "conv2d_bn_add",
                "conv2d_bn_add_relu",
            )
        ),
        Rule("conv1d", step.conv_alone, why_weighted, modes=_ALL, weighted=True),
        _fused("conv1d_relu", step.conv_unary, _CONV_ACT),
        Rule("conv2d", step.conv_alone, why_weighted, modes=_ALL, weighted=True),
        *(
            _fused(p, step.conv_unary, _CONV_ACT)
            for p in ("conv2d_relu", "conv2d_hardtanh", "conv2d_relu6", "conv2d_hardswish", "conv2d_silu")
        ),
        _fused("conv2d_add", step.conv_add, _CONV_ADD),
        _fused("conv2d_add_relu", step.conv_add_relu, _CONV_ADD),
        Rule("linear", step.linear_alone, why_weighted, modes=_ALL, weighted=True),
        *(
            _fused(p, step.linear_unary, _CONV_ACT)
            for p in ("linear_relu", "linear_leaky_relu", "linear_tanh", "linear_gelu")
        ),
        _fused("linear_add", step.linear_add, _CONV_ADD),
        _fused("linear_add_relu", step.linear_add_relu, _CONV_ADD),
        Rule("addmm", step.weight_matmuls, why_weight_matmul, modes=_ALL, weighted=True),
        *(
            Rule(p, step.weight_matmuls, why_weight_matmul, modes=_ALL, weighted=True, bias=None)
            for p in ("mm", "matmul_weight")
        ),
        Rule("mul", step.mul, why_two_inputs, modes=_ALL),
        *(_shares_input(p) for p in ("cat", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "flatten")),
        Rule("matmul", step.matmul, why_two_inputs, modes=_ALL, option="enable_matmul"),
    ],
    steps=[
        step.conv_bn,
        step.conv_add_relu,
        step.conv_add,
        step.conv_unary,
        step.conv_alone,
        step.linear_add_relu,
        step.linear_add,
        step.linear_unary,
        step.linear_alone,
        step.weight_matmuls,
        step.matmul,
        step.mul,
        step.propagate,
    ],
)


def declared_capabilities(
    is_dynamic: bool = False, reduce_range: bool = False, enable_matmul: bool = False, is_qat: bool = False
) -> tuple[Capability, ...]:
    """What an ``X86InductorQuantizer`` with these options annotates (conformance-tested).

    Conv and linear quantize their inputs (uint8 per-tensor activations, int8 per-channel
    symmetric weights on axis 0, float bias) and leave their output float for the next
    quantized op to quantize; a fused pattern (conv + relu, linear + add, ...) is one unit
    with no quantize/dequantize inside. addmm / mm / matmul of an activation and a constant
    weight stored [in, out] (GPT-2's Conv1D, ``x @ W``) are linears, their weight per channel
    on axis 1. Pooling, cat and flatten share their input's
    qparams, and are quantized only after one of x86's own quantized patterns.
    ``is_qat`` declares the QAT mode: the conv + batch norm patterns, whose last op
    fake-quantizes its own output, then everything the post-training recipe annotates."""
    act = TensorQuant("uint8", 0, 127 if reduce_range else 255, "per_tensor", symmetric=False)

    def weight(rule: Rule) -> TensorQuant:
        # addmm / mm / matmul weights are stored [in, out]: output channels on axis 1
        axis = 1 if rule.pattern in _IN_OUT_WEIGHTS else 0
        return TensorQuant("int8", -128, 127, "per_channel", symmetric=True, ch_axis=axis)

    mode = Mode.QAT if is_qat else Mode.DYNAMIC if is_dynamic else Mode.STATIC
    return TABLE.capabilities(mode, act, weight, options={"enable_matmul"} if enable_matmul else ())

"""What the XNNPACK quantizer declares, read off the rule table (:mod:`._rules`)."""

from __future__ import annotations

from quantweave.authoring import Rule
from quantweave.plugin_api import Capability, Mode, TensorQuant

from ._rules import TABLE

__all__ = ["declared_capabilities"]

#: linears written as matrix products: the weight is stored [in, out]
_IN_OUT_WEIGHTS = frozenset(("addmm", "mm", "matmul_weight"))


def declared_capabilities(
    is_per_channel: bool = False,
    is_qat: bool = False,
    is_dynamic: bool = False,
    act_qmin: int = -128,
    act_qmax: int = 127,
    weight_qmin: int = -127,
    weight_qmax: int = 127,
    act_granularity: str = "per_tensor",
    weight_group_size: int | None = None,
) -> tuple[Capability, ...]:
    """What an ``XNNPACKQuantizer`` whose global config is
    ``get_symmetric_quantization_config(...)`` with these arguments annotates
    (conformance-tested): int8 per-tensor affine activations, int8 symmetric weights
    (per-tensor, or per-channel with ``is_per_channel``: output channels, axis 0 for conv
    and linear, axis 1 for conv_transpose and for the [in, out] weight of addmm / mm /
    matmul_weight), float bias; static and QAT outputs get their own
    qparams, dynamic outputs stay float. Dynamic conv applies only to 4-D, non-depthwise
    weights (a note on the capability; the kit probes a 4-D conv). ``act_granularity=
    "per_token"`` (dynamic only): activations quantized per token at run time.
    ``weight_group_size``: linear only, weights per output channel and group (8da4w)."""
    act = TensorQuant("int8", act_qmin, act_qmax, act_granularity, symmetric=False)

    def weight(rule: Rule) -> TensorQuant:
        if not is_per_channel:
            return TensorQuant("int8", weight_qmin, weight_qmax, "per_tensor", symmetric=True)
        axis = 1 if rule.pattern.startswith("conv_transpose") or rule.pattern in _IN_OUT_WEIGHTS else 0
        return TensorQuant("int8", weight_qmin, weight_qmax, "per_channel", symmetric=True, ch_axis=axis)

    mode = Mode.DYNAMIC if is_dynamic else Mode.QAT if is_qat else Mode.STATIC
    if weight_group_size is not None:  # blockwise weights: linear only
        group = TensorQuant(
            "int8", weight_qmin, weight_qmax, "per_group", True, ch_axis=0, group_size=weight_group_size
        )
        return tuple(c for c in TABLE.capabilities(mode, act, lambda rule: group) if c.pattern == "linear")
    return TABLE.capabilities(mode, act, weight)

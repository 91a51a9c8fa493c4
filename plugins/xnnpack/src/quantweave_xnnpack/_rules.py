"""The XNNPACK rule table: what the quantizer declares and how it annotates, in one place.

:data:`TABLE` (an authoring-kit :class:`~quantweave.authoring.RuleTable`) has one row per
declared vocabulary pattern, in declaration order: the :class:`Matcher` that finds and
annotates it (``None``: the qparam-sharing pass after the matchers, whose rows say why such an
op stayed float), the modes it is declared in and how its output is quantized. The matchers
run in :data:`MATCHERS` order (the first to claim a node wins), each in the modes of the rows
that name it, and ``declared_capabilities`` (:mod:`._capabilities`) is read off the same rows,
so the declaration and the annotation cannot disagree. Why a match stays float is returned by
its matcher (:mod:`._patterns`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule

import quantweave as qw
from quantweave.authoring import Rule, RuleTable
from quantweave.plugin_api import Mode

from . import _patterns as p
from ._graph import ADD, CAT, CONV, CONV_T, LINEAR, MUL, POOL
from ._matmul import WEIGHT_MATMULS, find_weight_matmul
from ._share import no_quantized_input

__all__ = ["MATCHERS", "TABLE", "Matcher", "steps_for"]


@dataclass(frozen=True, eq=False)
class Matcher:
    """One way of finding and annotating a pattern: the step of the rows that name it."""

    name: str
    anchors: frozenset[Any]  # the anchor ops (operator-type configs select on these)
    find: Callable[[GraphModule], Iterator[p.Match]]

    def __call__(self, gm: GraphModule) -> Iterator[p.Match]:
        return self.find(gm)


_CONV_BN_RELU = Matcher("conv_bn_relu", CONV, lambda gm: p.find_conv_bn(gm, True))
_CONV_BN = Matcher("conv_bn", CONV, lambda gm: p.find_conv_bn(gm, False))
_CONV_T_BN_RELU = Matcher("conv_transpose_bn_relu", CONV_T, lambda gm: p.find_conv_bn(gm, True, True))
_CONV_T_BN = Matcher("conv_transpose_bn", CONV_T, lambda gm: p.find_conv_bn(gm, False, True))
_LINEAR_RELU = Matcher("linear_relu", LINEAR, p.find_linear_relu)
_LINEAR = Matcher("linear", LINEAR, p.find_linear)
_WEIGHT_MATMUL = Matcher("weight_matmul", WEIGHT_MATMULS, find_weight_matmul)
_CONV = Matcher("conv", CONV, lambda gm: p.find_conv(gm, False))
_CONV_T = Matcher("conv_transpose", CONV_T, lambda gm: p.find_conv(gm, True))
_CONV_RELU = Matcher("conv_relu", CONV, lambda gm: p.find_conv_relu(gm, False))
_CONV_T_RELU = Matcher("conv_transpose_relu", CONV_T, lambda gm: p.find_conv_relu(gm, True))
_POOL = Matcher("adaptive_avg_pool2d", POOL, p.find_adaptive_avg_pool2d)
_ADD_RELU = Matcher("add_relu", ADD, lambda gm: p.find_binary_relu(gm, ADD))
_ADD = Matcher("add", ADD, lambda gm: p.find_binary(gm, ADD))
_MUL_RELU = Matcher("mul_relu", MUL, lambda gm: p.find_binary_relu(gm, MUL))
_MUL = Matcher("mul", MUL, lambda gm: p.find_binary(gm, MUL))
_CAT = Matcher("cat", CAT, p.find_cat)

#: the matchers in the order they are applied
MATCHERS: tuple[Matcher, ...] = (
    _CONV_BN_RELU,
    _CONV_BN,
    _CONV_T_BN_RELU,
    _CONV_T_BN,
    _LINEAR_RELU,
    _LINEAR,
    _WEIGHT_MATMUL,
    _CONV,
    _CONV_T,
    _CONV_RELU,
    _CONV_T_RELU,
    _POOL,
    _ADD_RELU,
    _ADD,
    _MUL_RELU,
    _MUL,
    _CAT,
)

_QAT = (Mode.QAT,)
_STATIC = (Mode.STATIC, Mode.QAT)
_ALL = (Mode.STATIC, Mode.QAT, Mode.DYNAMIC)
#: a note on the dynamic declarations of conv
_DYNAMIC_CONV = {Mode.DYNAMIC: "dynamic: 4-D non-depthwise weights only"}


def _weighted(pattern: str, matcher: Matcher, modes: tuple[Mode, ...] = _STATIC, **kw: Any) -> Rule:
    return Rule(pattern, matcher, modes=modes, weighted=True, output="quantized", **kw)


def _own(pattern: str, matcher: Matcher, **kw: Any) -> Rule:
    return Rule(pattern, matcher, modes=_STATIC, output="quantized", **kw)


def _shared(pattern: str, matcher: Matcher | None = None) -> Rule:
    """Output (and, without a matcher, input) shares the input's qparams."""
    if matcher is not None:
        return Rule(pattern, matcher, modes=_STATIC, output="shared")
    return Rule(pattern, None, no_quantized_input, modes=_STATIC, output="shared", input_from="any")


#: one row per declared pattern, in declaration order
TABLE = RuleTable(
    "xnnpack",
    [
        _weighted("conv2d_bn", _CONV_BN, _QAT, fused=True),
        _weighted("conv2d_bn_relu", _CONV_BN_RELU, _QAT, fused=True),
        _weighted("conv2d_bn_hardtanh", _CONV_BN, _QAT, fused=False),  # hardtanh / relu6 share the output
        _weighted("conv2d_bn_relu6", _CONV_BN, _QAT, fused=False),
        _weighted("conv_transpose2d_bn", _CONV_T_BN, _QAT, fused=True),
        _weighted("conv_transpose2d_bn_relu", _CONV_T_BN_RELU, _QAT, fused=True),
        _weighted("conv1d", _CONV),
        _weighted("conv1d_relu", _CONV_RELU, fused=True),
        _weighted("conv2d", _CONV, _ALL, notes=_DYNAMIC_CONV),
        _weighted("conv2d_relu", _CONV_RELU, fused=True),
        _weighted("conv2d_hardtanh", _CONV, fused=False),
        _weighted("conv2d_relu6", _CONV, fused=False),
        _weighted("conv_transpose2d", _CONV_T, _ALL, notes=_DYNAMIC_CONV),
        _weighted("conv_transpose2d_relu", _CONV_T_RELU, fused=True),
        _weighted("linear", _LINEAR, _ALL),
        _weighted("linear_relu", _LINEAR_RELU, fused=True),
        _weighted("addmm", _WEIGHT_MATMUL, _ALL),  # weight stored [in, out] (GPT-2's Conv1D)
        _weighted("mm", _WEIGHT_MATMUL, _ALL, bias=None),
        _weighted("matmul_weight", _WEIGHT_MATMUL, _ALL, bias=None),
        _own("add", _ADD),
        _own("add_relu", _ADD_RELU, fused=True),
        _own("mul", _MUL),
        _own("mul_relu", _MUL_RELU, fused=True),
        _shared("cat", _CAT),
        _shared("adaptive_avg_pool2d", _POOL),
        *(
            _shared(name)
            for name in (
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
        ),
    ],
    steps=MATCHERS,
)


def _qat_only(matcher: Matcher) -> bool:
    return all(r.modes == _QAT for r in TABLE if r.annotate is matcher)


def steps_for(config: qw.QuantizationConfig | None) -> list[Matcher]:
    """The matchers a stage with ``config`` applies, in order: those of the rows declared in
    the config's mode (a dynamic QAT config also applies the QAT-only ones); a ``None``
    config claims whatever any matcher finds, to leave it float."""
    if config is None:
        return list(MATCHERS)
    act = config.input_activation
    if act is not None and act.is_dynamic:
        dynamic = TABLE.steps_for(Mode.DYNAMIC)
        return [m for m in MATCHERS if m in dynamic or (config.is_qat and _qat_only(m))]
    declared = TABLE.steps_for(Mode.QAT if config.is_qat else Mode.STATIC)
    return [m for m in MATCHERS if m in declared]

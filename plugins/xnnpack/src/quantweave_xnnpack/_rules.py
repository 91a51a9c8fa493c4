"""The XNNPACK rule table: what the quantizer declares and how it annotates, in one place.

:data:`MATCHERS` are the ways a pattern is found and annotated, in the order the quantizer
applies them (the first to claim a node wins); :data:`RULES` are the vocabulary patterns it
declares, one row each, naming the matcher that annotates the pattern (``None``: the
qparam-sharing pass after the matchers), the modes it is declared in and how its output is
quantized. ``declared_capabilities`` (:mod:`._capabilities`) is read off the rows, and the
modes a matcher is applied in are the modes of the rows that name it, so the declaration
and the annotation cannot disagree. Why a match stays float is said by the matcher
(:mod:`._patterns`) and by the pass that explains what is left (:mod:`._share`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule

import quantweave as qw
from quantweave.plugin_api import Mode

from . import _patterns as p
from ._graph import ADD, CONV, CONV_T, LINEAR, MUL

__all__ = ["MATCHERS", "RULES", "Matcher", "Rule", "applies"]


@dataclass(frozen=True)
class Matcher:
    """One way of finding and annotating a pattern."""

    name: str
    anchors: frozenset[Any]  # the anchor ops (operator-type configs select on these)
    find: Callable[[GraphModule], Iterator[p.Match]]
    weighted: bool = False  # a conv / linear: weight quantized, bias float

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in RULES if r.matcher is self)

    @property
    def dynamic(self) -> bool:
        """Applied by a dynamic config."""
        return any(Mode.DYNAMIC in r.modes for r in self.rules)

    @property
    def qat_only(self) -> bool:
        """Applied only by a QAT config."""
        return all(r.modes == {Mode.QAT} for r in self.rules)


_CONV_BN_RELU = Matcher("conv_bn_relu", CONV, lambda gm: p.find_conv_bn(gm, True), True)
_CONV_BN = Matcher("conv_bn", CONV, lambda gm: p.find_conv_bn(gm, False), True)
_CONV_T_BN_RELU = Matcher("conv_transpose_bn_relu", CONV_T, lambda gm: p.find_conv_bn(gm, True, True), True)
_CONV_T_BN = Matcher("conv_transpose_bn", CONV_T, lambda gm: p.find_conv_bn(gm, False, True), True)
_LINEAR_RELU = Matcher("linear_relu", LINEAR, p.find_linear_relu, True)
_LINEAR = Matcher("linear", LINEAR, p.find_linear, True)
_CONV = Matcher("conv", CONV, lambda gm: p.find_conv(gm, False), True)
_CONV_T = Matcher("conv_transpose", CONV_T, lambda gm: p.find_conv(gm, True), True)
_CONV_RELU = Matcher("conv_relu", CONV, lambda gm: p.find_conv_relu(gm, False), True)
_CONV_T_RELU = Matcher("conv_transpose_relu", CONV_T, lambda gm: p.find_conv_relu(gm, True), True)
_POOL = Matcher("adaptive_avg_pool2d", p.POOL, p.find_adaptive_avg_pool2d)
_ADD_RELU = Matcher("add_relu", ADD, lambda gm: p.find_binary_relu(gm, ADD))
_ADD = Matcher("add", ADD, lambda gm: p.find_binary(gm, ADD))
_MUL_RELU = Matcher("mul_relu", MUL, lambda gm: p.find_binary_relu(gm, MUL))
_MUL = Matcher("mul", MUL, lambda gm: p.find_binary(gm, MUL))
_CAT = Matcher("cat", p.CAT, p.find_cat)

#: the matchers in the order they are applied
MATCHERS: tuple[Matcher, ...] = (
    _CONV_BN_RELU,
    _CONV_BN,
    _CONV_T_BN_RELU,
    _CONV_T_BN,
    _LINEAR_RELU,
    _LINEAR,
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

_QAT = frozenset({Mode.QAT})
_STATIC = frozenset({Mode.STATIC, Mode.QAT})
_ALL = frozenset({Mode.STATIC, Mode.QAT, Mode.DYNAMIC})
_DYNAMIC_CONV = "dynamic: 4-D non-depthwise weights only"


@dataclass(frozen=True)
class Rule:
    """One declared pattern: the matcher that annotates it, in which modes, and its output."""

    pattern: str  # vocabulary name
    matcher: Matcher | None  # None: quantized by the qparam-sharing pass where its input is
    modes: frozenset[Mode] = _STATIC
    shares_input: bool = False  # output takes its input's qparams (else its own; float when dynamic)
    fused: bool | None = None  # multi-op patterns: one quantized unit (False: relu6 / hardtanh share the output)
    dynamic_note: str = ""


def _share(pattern: str) -> Rule:
    return Rule(pattern, None, shares_input=True)


#: the declared patterns, in declaration order
RULES: tuple[Rule, ...] = (
    Rule("conv2d_bn", _CONV_BN, _QAT, fused=True),
    Rule("conv2d_bn_relu", _CONV_BN_RELU, _QAT, fused=True),
    Rule("conv2d_bn_hardtanh", _CONV_BN, _QAT, fused=False),
    Rule("conv2d_bn_relu6", _CONV_BN, _QAT, fused=False),
    Rule("conv_transpose2d_bn", _CONV_T_BN, _QAT, fused=True),
    Rule("conv_transpose2d_bn_relu", _CONV_T_BN_RELU, _QAT, fused=True),
    Rule("conv1d", _CONV),
    Rule("conv1d_relu", _CONV_RELU, fused=True),
    Rule("conv2d", _CONV, _ALL, dynamic_note=_DYNAMIC_CONV),
    Rule("conv2d_relu", _CONV_RELU, fused=True),
    Rule("conv2d_hardtanh", _CONV, fused=False),
    Rule("conv2d_relu6", _CONV, fused=False),
    Rule("conv_transpose2d", _CONV_T, _ALL, dynamic_note=_DYNAMIC_CONV),
    Rule("conv_transpose2d_relu", _CONV_T_RELU, fused=True),
    Rule("linear", _LINEAR, _ALL),
    Rule("linear_relu", _LINEAR_RELU, fused=True),
    Rule("add", _ADD),
    Rule("add_relu", _ADD_RELU, fused=True),
    Rule("mul", _MUL),
    Rule("mul_relu", _MUL_RELU, fused=True),
    Rule("cat", _CAT, shares_input=True),
    Rule("adaptive_avg_pool2d", _POOL, shares_input=True),
    *(
        _share(name)
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
)


def applies(matcher: Matcher, config: qw.QuantizationConfig | None) -> bool:
    """Whether a stage with ``config`` applies ``matcher`` (a ``None`` config claims whatever
    any matcher finds, to leave it float)."""
    if config is None:
        return True
    act = config.input_activation
    if act is not None and act.is_dynamic:
        return matcher.dynamic or (config.is_qat and matcher.qat_only)
    return config.is_qat or not matcher.qat_only

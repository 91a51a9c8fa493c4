"""XNNPACK quantizer: ExecuTorch's XNNPACK recipe, matched on the exported aten graph.

The recipe (semantics of ExecuTorch 1.5.1's ``XNNPACKQuantizer``, so the XNNPACK
partitioner lowers the result):

- int8 activations (per-tensor affine, ``[act_qmin, act_qmax]``, default [-128, 127]; dynamic
  configs may take them per token with ``act_granularity="per_token"``),
  int8 symmetric weights (per-tensor, or per-channel with ``is_per_channel``; default
  [-127, 127], 4-bit with ``weight_qmin=-8, weight_qmax=7``), float bias;
- patterns, in this order (the first to claim a node wins): conv + batch norm (+ relu),
  conv_transpose + batch norm (+ relu) [QAT configs], linear + relu, linear, conv,
  conv_transpose, conv + relu,
  conv_transpose + relu, adaptive_avg_pool2d, add + relu, add, mul + relu, mul, cat.
  A dynamic config applies only linear, conv (4-D, non-depthwise weight) and
  conv_transpose (plus conv / conv_transpose + batch norm when it is also QAT);
- a conv whose only user is relu is left to conv + relu; conv_transpose only with
  ``groups == 1``, its weight per-channel along axis 1 (its output channels);
- add / mul: scalar operands become buffers first (:meth:`XNNPACKQuantizer.transform_for_annotation`);
  an operand that is not a float32 tensor, or a scalar beyond ``torch.histc``'s range
  (> 3.4e15), leaves the node float;
- cat: the first input whose qparams come from an annotated producer owns the observer;
  the other inputs and the output share it. adaptive_avg_pool2d: input shares the
  producer's output qparams when it has them, output shares the input;
- afterwards, relu, relu6, hardtanh, max_pool2d, mean, permute, transpose, squeeze, view,
  reshape, slice, flatten, dropout and adaptive_avg_pool2d whose input has output qparams
  share them (input and output).

Configs: module name > module type > operator type > global, selecting each pattern by its
anchor op (the conv, linear, add...); ``set_filter_function`` must accept every compute node
of a pattern; a config of ``None`` leaves the matched nodes float and records why.
Everything is matched on aten ops (not source partitions), so functional and module forms
are found under default non-strict ``torch.export``. Differences from ExecuTorch are
listed in the package README.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.observers import (
    FakeQuantize,
    FusedMovingAvgObsFakeQuantize,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from quantweave.plugin_api import (
    ANNOTATION_KEY,
    Capability,
    mark_annotated,
    set_skip_reason,
    warn_unknown_modules,
)

from ._capabilities import declared_capabilities

__all__ = ["ACT_GRANULARITIES", "XNNPACKQuantizer", "get_symmetric_quantization_config"]

#: the dynamic activation granularities of :func:`get_symmetric_quantization_config`
ACT_GRANULARITIES = ("per_tensor", "per_token")

aten = torch.ops.aten

_CONV = frozenset(
    (
        aten.conv1d.default,
        aten.conv1d.padding,
        aten.conv2d.default,
        aten.conv2d.padding,
        aten.conv3d.default,
        aten.conv3d.padding,
    )
)
_CONV_T = frozenset((aten.conv_transpose1d.default, aten.conv_transpose2d.input, aten.conv_transpose3d.input))
_LINEAR = frozenset((aten.linear.default,))
_ADD = frozenset((aten.add.Tensor, aten.add_.Tensor))
_MUL = frozenset((aten.mul.Tensor, aten.mul_.Tensor))
_CAT = frozenset((aten.cat.default,))
_POOL = frozenset((aten.adaptive_avg_pool2d.default,))
_RELU = frozenset((aten.relu.default, aten.relu_.default))
_BATCH_NORM = frozenset((aten.batch_norm.default,))
#: ops whose output takes their (first) input's qparams when that input has output qparams
_SHARE_QPARAMS = frozenset(
    (
        aten.relu.default,
        aten.relu_.default,
        aten.relu6.default,
        aten.relu6_.default,
        aten.hardtanh.default,
        aten.hardtanh_.default,
        aten.max_pool2d.default,
        aten.mean.default,
        aten.mean.dim,
        aten.permute.default,
        aten.permute_copy.default,
        aten.transpose.int,
        aten.squeeze.dim,
        aten.squeeze_copy.dim,
        aten.adaptive_avg_pool2d.default,
        aten.view_copy.default,
        aten.view.default,
        aten.reshape.default,
        aten.slice.Tensor,
        aten.slice_copy.Tensor,
        aten.flatten.using_ints,
        aten.dropout.default,
        aten.dropout_.default,
    )
)
#: compute ops a filter function can reject (named when they stay float for that reason)
_FILTERED = _CONV | _CONV_T | _LINEAR | _ADD | _MUL | _CAT | _POOL | _SHARE_QPARAMS
#: torch.histc (inside HistogramObserver) fails beyond this magnitude
_HISTC_LIMIT = 3.4028235e15


@functools.lru_cache(typed=True)
def get_symmetric_quantization_config(
    is_per_channel: bool = False,
    is_qat: bool = False,
    is_dynamic: bool = False,
    act_qmin: int = -128,
    act_qmax: int = 127,
    weight_qmin: int = -127,
    weight_qmax: int = 127,
    act_granularity: str = "per_tensor",
) -> qw.QuantizationConfig:
    """The XNNPACK recipe: int8 per-tensor affine activations in ``[act_qmin, act_qmax]``
    (HistogramObserver; PlaceholderObserver when dynamic, whose config then quantizes no
    outputs), int8 symmetric weights in ``[weight_qmin, weight_qmax]`` (MinMaxObserver, or
    PerChannelMinMaxObserver along axis 0 with ``is_per_channel``), float bias; all with
    ``eps=2**-12``. ``weight_qmin=-8, weight_qmax=7`` gives 4-bit weights stored in int8.

    ``is_qat=True``: fake-quantizers for ``prepare_qat_pt2e`` (FusedMovingAvgObsFakeQuantize
    over moving-average min/max observers; dynamic activations: FakeQuantize over a
    MovingAverageMinMaxObserver with averaging constant 1).

    ``act_granularity`` (dynamic configs): ``"per_tensor"`` (default, ExecuTorch's
    ``XNNPACKQuantizer``: one (scale, zero point) per call, ``choose_qparams.tensor``) or
    ``"per_token"``: one per row over the last dimension, chosen at run time
    (``QuantizationSpec(per_token=True)``: ``choose_qparams_per_token_asymmetric``), which is
    what XNNPACK's dynamically quantized linear computes, so the lowered program matches the
    converted model. ``"per_token"`` needs ``is_dynamic=True``, ``is_qat=False`` and the full
    int8 activation range [-128, 127]."""
    for name, value in (("is_per_channel", is_per_channel), ("is_qat", is_qat), ("is_dynamic", is_dynamic)):
        if not isinstance(value, bool):
            raise TypeError(f"get_symmetric_quantization_config: {name} must be a bool; got {value!r}")
    if act_granularity not in ACT_GRANULARITIES:
        raise ValueError(
            f"get_symmetric_quantization_config: act_granularity must be one of {', '.join(ACT_GRANULARITIES)}; "
            f"got {act_granularity!r}"
        )
    per_token = act_granularity == "per_token"
    if per_token and (not is_dynamic or is_qat or (act_qmin, act_qmax) != (-128, 127)):
        raise ValueError(
            "get_symmetric_quantization_config: act_granularity='per_token' chooses int8 qparams per token at run "
            "time: it needs is_dynamic=True, is_qat=False, act_qmin=-128, act_qmax=127; got "
            f"is_dynamic={is_dynamic}, is_qat={is_qat}, act_qmin={act_qmin}, act_qmax={act_qmax}"
        )
    act_ctr: Any
    if is_qat and is_dynamic:
        act_ctr = FakeQuantize.with_args(
            eps=2**-12, observer=MovingAverageMinMaxObserver.with_args(averaging_constant=1)
        )
    elif is_qat:
        act_ctr = FusedMovingAvgObsFakeQuantize.with_args(eps=2**-12)
    else:
        act_ctr = (PlaceholderObserver if is_dynamic else HistogramObserver).with_args(eps=2**-12)
    weight_ctr: Any
    if is_qat:
        observer = MovingAveragePerChannelMinMaxObserver if is_per_channel else MovingAverageMinMaxObserver
        weight_ctr = FusedMovingAvgObsFakeQuantize.with_args(eps=2**-12, observer=observer)
    else:
        weight_ctr = (PerChannelMinMaxObserver if is_per_channel else MinMaxObserver).with_args(eps=2**-12)
    act = qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=act_qmin,
        quant_max=act_qmax,
        qscheme=torch.per_tensor_affine,
        is_dynamic=is_dynamic,
        observer_or_fake_quant_ctr=act_ctr,
        per_token=per_token,
    )
    weight = qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=weight_qmin,
        quant_max=weight_qmax,
        qscheme=torch.per_channel_symmetric if is_per_channel else torch.per_tensor_symmetric,
        ch_axis=0,
        observer_or_fake_quant_ctr=weight_ctr,
    )
    return qw.QuantizationConfig(act, None if is_dynamic else act, weight, None, is_qat)


# -- graph helpers ------------------------------------------------------------------------------


def _calls(node: Any, targets: Iterable[Any]) -> TypeGuard[Node]:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


def _is_float32(node: Any) -> bool:
    val = _val(node)
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


def _only_user(node: Node) -> Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _attr(gm: torch.nn.Module, target: str) -> Any:
    return functools.reduce(getattr, target.split("."), gm)


def _is_huge_scalar(node: Node) -> bool:
    if node.op != "get_attr" or not isinstance(node.target, str):
        return False
    owner = node.graph.owning_module
    try:
        value = _attr(owner, node.target) if owner is not None else None
    except AttributeError:
        return False
    return isinstance(value, torch.Tensor) and value.numel() == 1 and abs(float(value.item())) > _HISTC_LIMIT


def _weight_shape(node: Any) -> tuple[int, ...] | None:
    """Shape of a weight: from its fake value, or (a get_attr whose value a pass did not
    record, e.g. a batch-norm-folded weight) from the tensor itself."""
    val = _val(node)
    if isinstance(val, torch.Tensor):
        return tuple(val.shape)
    if isinstance(node, Node) and node.op == "get_attr" and node.graph.owning_module is not None:
        try:
            value = _attr(node.graph.owning_module, str(node.target))
        except AttributeError:
            return None
        return tuple(value.shape) if isinstance(value, torch.Tensor) else None
    return None


def _module_paths(node: Node) -> list[str]:
    out = []
    for entry in node.meta.get("nn_module_stack", {}).values():
        path = entry[0] if isinstance(entry, tuple) else str(entry)
        out.append(path.removeprefix("L['self']."))
    return out


def _module_types(node: Node) -> set[str]:
    out = set()
    for entry in node.meta.get("nn_module_stack", {}).values():
        if isinstance(entry, tuple) and len(entry) > 1:
            kind = entry[1]
            out.add(f"{kind.__module__}.{kind.__qualname__}" if isinstance(kind, type) else str(kind))
    return out


def _type_name(module_type: type) -> str:
    return f"{module_type.__module__}.{module_type.__qualname__}"


def _conv_transpose_groups(node: Node) -> int:
    groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
    return groups if isinstance(groups, int) else 1


def _transpose_weight_spec(spec: qw.QuantizationSpec) -> qw.QuantizationSpec:
    """A transposed conv's weight is (in, out / groups, ...): its output channels are axis 1.

    torch's fused fake-quantizer supports per-channel only along axis 0, so a per-channel QAT
    weight spec built on it gets the unfused ``FakeQuantize`` with the same arguments."""
    spec = replace(spec, ch_axis=1)
    per_channel = spec.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine)
    partial = getattr(spec.observer_or_fake_quant_ctr, "p", None)
    if per_channel and getattr(partial, "func", None) is FusedMovingAvgObsFakeQuantize:
        keywords = dict(getattr(partial, "keywords", {}))
        spec = replace(spec, observer_or_fake_quant_ctr=FakeQuantize.with_args(**keywords))
    return spec


# -- matches ------------------------------------------------------------------------------------


@dataclass
class _Match:
    """One occurrence of a pattern: its compute nodes, and how to annotate it."""

    nodes: list[Node]  # the call_function nodes the pattern claims (filters look at these)
    anchor: Node
    annotate: Callable[[qw.QuantizationConfig], str | None]  # returns a reason to leave it float, or None


NodeFilter = Callable[[Node], bool]


class _Patterns:
    """The XNNPACK patterns over one graph; each ``find_*`` yields matches in graph order."""

    def __init__(self, gm: GraphModule) -> None:
        self.gm = gm

    # weighted ops

    @staticmethod
    def _weighted(node: Node, config: qw.QuantizationConfig, transpose: bool) -> None:
        x, weight = node.args[0], node.args[1]
        if isinstance(x, Node):
            qw.annotate_input_qspec_map(node, x, config.input_activation)
        if isinstance(weight, Node):
            spec = config.weight
            if transpose and spec is not None:
                spec = _transpose_weight_spec(spec)
            qw.annotate_input_qspec_map(node, weight, spec)
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        if isinstance(bias, Node):
            qw.annotate_input_qspec_map(node, bias, config.bias)

    def find_conv_bn(self, with_relu: bool, transpose: bool = False) -> Iterator[_Match]:
        for conv in list(self.gm.graph.nodes):
            if not _calls(conv, _CONV_T if transpose else _CONV):
                continue
            if transpose and _conv_transpose_groups(conv) != 1:
                continue  # left to conv_transpose, which records why
            bn = _only_user(conv)
            if bn is None or not _calls(bn, _BATCH_NORM) or bn.args[0] is not conv:
                continue
            relu = _only_user(bn) if with_relu else None
            if with_relu and (relu is None or not _calls(relu, _RELU)):
                continue
            last = relu if relu is not None else bn

            def annotate(config: qw.QuantizationConfig, conv: Node = conv, last: Node = last) -> str | None:
                self._weighted(conv, config, transpose)
                qw.annotate_output_qspec(last, config.output_activation)
                return None

            nodes = [conv, bn] + ([relu] if relu is not None else [])
            yield _Match(nodes, conv, annotate)

    def find_linear_relu(self) -> Iterator[_Match]:
        for relu in list(self.gm.graph.nodes):
            if not _calls(relu, _RELU):
                continue
            linear = relu.args[0]
            if not _calls(linear, _LINEAR) or len(linear.users) != 1:
                continue

            def annotate(config: qw.QuantizationConfig, linear: Node = linear, relu: Node = relu) -> str | None:
                self._weighted(linear, config, False)
                qw.annotate_output_qspec(relu, config.output_activation)
                return None

            yield _Match([linear, relu], linear, annotate)

    def find_linear(self) -> Iterator[_Match]:
        for linear in list(self.gm.graph.nodes):
            if not _calls(linear, _LINEAR):
                continue

            def annotate(config: qw.QuantizationConfig, linear: Node = linear) -> str | None:
                self._weighted(linear, config, False)
                qw.annotate_output_qspec(linear, config.output_activation)
                return None

            yield _Match([linear], linear, annotate)

    def find_conv(self, transpose: bool) -> Iterator[_Match]:
        convs = _CONV_T if transpose else _CONV
        for conv in list(self.gm.graph.nodes):
            if not _calls(conv, convs):
                continue
            user = _only_user(conv)
            if user is not None and _calls(user, _RELU):
                continue  # left to conv + relu

            def annotate(config: qw.QuantizationConfig, conv: Node = conv) -> str | None:
                if transpose and _conv_transpose_groups(conv) != 1:
                    return "conv_transpose with groups != 1 is not quantized for XNNPACK"
                act = config.input_activation
                if act is not None and act.is_dynamic:
                    shape = _weight_shape(conv.args[1])
                    if shape is not None and len(shape) != 4:
                        return "dynamic quantization of conv needs a 4-D (conv2d) weight"
                    if not transpose and shape is not None and shape[1] == 1:
                        return "dynamic quantization of a depthwise conv is not supported by XNNPACK"
                self._weighted(conv, config, transpose)
                qw.annotate_output_qspec(conv, config.output_activation)
                return None

            yield _Match([conv], conv, annotate)

    def find_conv_relu(self, transpose: bool) -> Iterator[_Match]:
        convs = _CONV_T if transpose else _CONV
        for relu in list(self.gm.graph.nodes):
            if not _calls(relu, _RELU):
                continue
            conv = relu.args[0]
            if not _calls(conv, convs) or len(conv.users) != 1:
                continue

            def annotate(config: qw.QuantizationConfig, conv: Node = conv, relu: Node = relu) -> str | None:
                if transpose and _conv_transpose_groups(conv) != 1:
                    return "conv_transpose with groups != 1 is not quantized for XNNPACK"
                self._weighted(conv, config, transpose)
                qw.annotate_output_qspec(relu, config.output_activation)
                return None

            yield _Match([conv, relu], conv, annotate)

    def find_adaptive_avg_pool2d(self) -> Iterator[_Match]:
        for pool in list(self.gm.graph.nodes):
            if not _calls(pool, _POOL) or not isinstance(pool.args[0], Node):
                continue

            def annotate(config: qw.QuantizationConfig, pool: Node = pool) -> str | None:
                x = pool.args[0]
                assert isinstance(x, Node)
                spec: Any = config.input_activation
                if _has_output_qparams(x):
                    spec = qw.SharedQuantizationSpec(x)
                qw.annotate_input_qspec_map(pool, x, spec)
                qw.annotate_output_qspec(pool, qw.SharedQuantizationSpec((x, pool)))
                return None

            yield _Match([pool], pool, annotate)

    @staticmethod
    def _binary_reason(node: Node) -> str | None:
        for operand in node.args[:2]:
            if not isinstance(operand, Node):
                continue
            if _is_huge_scalar(operand):
                return f"operand {operand.name!r} is a scalar beyond torch.histc's range (> 3.4e15)"
            if not _is_float32(operand):
                return f"operand {operand.name!r} is not a float32 tensor"
        return None

    def _annotate_binary(self, node: Node, config: qw.QuantizationConfig, output: Node | None) -> str | None:
        reason = self._binary_reason(node)
        if reason is not None:
            return reason
        for operand in node.args[:2]:
            if isinstance(operand, Node):
                qw.annotate_input_qspec_map(node, operand, config.input_activation)
        if output is None:
            qw.annotate_output_qspec(node, config.output_activation)
        else:
            qw.annotate_output_qspec(output, config.output_activation)
        return None

    def find_binary_relu(self, ops: frozenset[Any]) -> Iterator[_Match]:
        for relu in list(self.gm.graph.nodes):
            if not _calls(relu, _RELU):
                continue
            node = relu.args[0]
            if not _calls(node, ops) or len(node.users) != 1:
                continue

            def annotate(config: qw.QuantizationConfig, node: Node = node, relu: Node = relu) -> str | None:
                return self._annotate_binary(node, config, relu)

            yield _Match([node, relu], node, annotate)

    def find_binary(self, ops: frozenset[Any]) -> Iterator[_Match]:
        for node in list(self.gm.graph.nodes):
            if not _calls(node, ops):
                continue

            def annotate(config: qw.QuantizationConfig, node: Node = node) -> str | None:
                return self._annotate_binary(node, config, None)

            yield _Match([node], node, annotate)

    def find_cat(self) -> Iterator[_Match]:
        for cat in list(self.gm.graph.nodes):
            if not _calls(cat, _CAT) or not isinstance(cat.args[0], (list, tuple)) or not cat.args[0]:
                continue

            def annotate(config: qw.QuantizationConfig, cat: Node = cat) -> str | None:
                inputs = [i for i in cat.args[0] if isinstance(i, Node)]  # type: ignore[union-attr]
                if len(inputs) != len(cat.args[0]) or not all(_is_float32(i) for i in inputs):  # type: ignore[arg-type]
                    return "cat of tensors that are not all float32"
                owner = next((i for i in inputs if _traces_to_output_qparams(i)), inputs[0])
                qw.annotate_input_qspec_map(cat, owner, config.input_activation)
                shared = qw.SharedQuantizationSpec((owner, cat))
                for other in inputs:
                    if other is not owner:
                        qw.annotate_input_qspec_map(cat, other, shared)
                qw.annotate_output_qspec(cat, shared)
                return None

            yield _Match([cat], cat, annotate)


def _annotation(node: Node) -> Any:
    return node.meta.get(ANNOTATION_KEY)


def _has_output_qparams(node: Node) -> bool:
    annotation = _annotation(node)
    return annotation is not None and qw.is_annotated(node) and annotation.output_qspec is not None


def _traces_to_output_qparams(node: Node) -> bool:
    """True when ``node``, or the producer it reaches through qparam-sharing ops, has output qparams."""
    seen: set[Node] = set()
    current: Any = node
    while isinstance(current, Node) and current not in seen:
        seen.add(current)
        if _has_output_qparams(current):
            return True
        if not _calls(current, _SHARE_QPARAMS) or not current.args:
            return False
        current = current.args[0]
    return False


@dataclass(frozen=True)
class _Pattern:
    name: str
    dynamic: bool  # applied by a dynamic config
    qat_only: bool  # applied only by a QAT config
    anchors: frozenset[Any]  # the anchor ops (operator-type configs select on these)
    find: Callable[[_Patterns], Iterator[_Match]]


_PATTERNS: tuple[_Pattern, ...] = (
    _Pattern("conv_bn_relu", False, True, _CONV, lambda p: p.find_conv_bn(True)),
    _Pattern("conv_bn", False, True, _CONV, lambda p: p.find_conv_bn(False)),
    _Pattern("conv_transpose_bn_relu", False, True, _CONV_T, lambda p: p.find_conv_bn(True, transpose=True)),
    _Pattern("conv_transpose_bn", False, True, _CONV_T, lambda p: p.find_conv_bn(False, transpose=True)),
    _Pattern("linear_relu", False, False, _LINEAR, lambda p: p.find_linear_relu()),
    _Pattern("linear", True, False, _LINEAR, lambda p: p.find_linear()),
    _Pattern("conv", True, False, _CONV, lambda p: p.find_conv(False)),
    _Pattern("conv_transpose", True, False, _CONV_T, lambda p: p.find_conv(True)),
    _Pattern("conv_relu", False, False, _CONV, lambda p: p.find_conv_relu(False)),
    _Pattern("conv_transpose_relu", False, False, _CONV_T, lambda p: p.find_conv_relu(True)),
    _Pattern("adaptive_avg_pool2d", False, False, _POOL, lambda p: p.find_adaptive_avg_pool2d()),
    _Pattern("add_relu", False, False, _ADD, lambda p: p.find_binary_relu(_ADD)),
    _Pattern("add", False, False, _ADD, lambda p: p.find_binary(_ADD)),
    _Pattern("mul_relu", False, False, _MUL, lambda p: p.find_binary_relu(_MUL)),
    _Pattern("mul", False, False, _MUL, lambda p: p.find_binary(_MUL)),
    _Pattern("cat", False, False, _CAT, lambda p: p.find_cat()),
)

#: pattern names, in the order they are applied
SUPPORTED_PATTERNS: tuple[str, ...] = tuple(p.name for p in _PATTERNS)


def _applies(pattern: _Pattern, config: qw.QuantizationConfig | None) -> bool:
    if config is None:  # a None config claims whatever any pattern matches
        return True
    act = config.input_activation
    if act is not None and act.is_dynamic:
        return pattern.dynamic or (config.is_qat and pattern.qat_only)
    return config.is_qat or not pattern.qat_only


@dataclass(frozen=True)
class _Stage:
    config: qw.QuantizationConfig | None
    accepts: NodeFilter
    description: str
    operator: Any = None  # operator-type stage: only patterns anchored on this op


def _op_matches(operator: Any, target: Any) -> bool:
    if isinstance(operator, torch._ops.OpOverloadPacket):
        return getattr(target, "overloadpacket", None) is operator
    return bool(target == operator)


def _module_name_filter(name: str) -> NodeFilter:
    return lambda n: name in _module_paths(n)


def _module_type_filter(module_type: type) -> NodeFilter:
    qualified = _type_name(module_type)
    return lambda n: qualified in _module_types(n)


def _outside_filter(names: tuple[str, ...], types: frozenset[str]) -> NodeFilter:
    """Nodes in no submodule that has a module name or module type config."""

    def accepts(n: Node) -> bool:
        return not any(name in _module_paths(n) for name in names) and not (_module_types(n) & types)

    return accepts


class XNNPACKQuantizer(qw.Quantizer):
    """ExecuTorch's XNNPACK recipe (see the module docstring), configured like ExecuTorch's
    ``XNNPACKQuantizer``: nothing is quantized until a config is set::

        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))

    ``qw.get_quantizer("xnnpack", **options)`` returns one whose global config is
    ``get_symmetric_quantization_config(**options)``.
    """

    name = "xnnpack"

    def __init__(self) -> None:
        self.global_config: qw.QuantizationConfig | None = None
        self.operator_type_config: dict[Any, qw.QuantizationConfig | None] = {}
        self.module_type_config: dict[type, qw.QuantizationConfig | None] = {}
        self.module_name_config: dict[str, qw.QuantizationConfig | None] = {}
        self.filter_fn: NodeFilter | None = None

    # -- configuration -------------------------------------------------------------------------

    @staticmethod
    def _check_config(setter: str, config: Any) -> None:
        if config is not None and not isinstance(config, qw.QuantizationConfig):
            raise TypeError(f"{setter}: expected a quantweave.QuantizationConfig or None; got {type(config).__name__}")

    def set_global(self, quantization_config: qw.QuantizationConfig | None) -> XNNPACKQuantizer:
        """The config for every node no module name, module type or operator type config claims."""
        self._check_config("set_global", quantization_config)
        self.global_config = quantization_config
        return self

    def get_global_quantization_config(self) -> qw.QuantizationConfig | None:
        return self.global_config

    def set_operator_type(
        self, operator_type: Any, quantization_config: qw.QuantizationConfig | None
    ) -> XNNPACKQuantizer:
        """Config for the patterns anchored on one aten op (``torch.ops.aten.linear.default``,
        or a packet such as ``torch.ops.aten.conv2d`` for all its overloads)."""
        if not isinstance(operator_type, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            raise TypeError(
                f"set_operator_type: expected an aten op such as torch.ops.aten.linear.default; got {operator_type!r}"
            )
        if not any(_op_matches(operator_type, t) for p in _PATTERNS for t in p.anchors):
            anchors = sorted({str(t) for p in _PATTERNS for t in p.anchors})
            raise ValueError(
                f"set_operator_type: {operator_type} anchors no XNNPACK pattern; supported: {', '.join(anchors)}"
            )
        self._check_config("set_operator_type", quantization_config)
        self.operator_type_config[operator_type] = quantization_config
        return self

    def set_module_type(
        self, module_type: type[torch.nn.Module], quantization_config: qw.QuantizationConfig | None
    ) -> XNNPACKQuantizer:
        """Config for every pattern inside a submodule of type ``module_type`` (any depth)."""
        if not isinstance(module_type, type):
            raise TypeError(f"set_module_type: expected a module class; got {module_type!r}")
        self._check_config("set_module_type", quantization_config)
        self.module_type_config[module_type] = quantization_config
        return self

    def set_module_name(self, module_name: str, quantization_config: qw.QuantizationConfig | None) -> XNNPACKQuantizer:
        """Config for every pattern inside the submodule ``module_name`` (e.g. ``"blocks.0"``);
        ``None`` leaves it float."""
        if not isinstance(module_name, str) or not module_name:
            raise ValueError(f"set_module_name: module_name must be a non-empty str; got {module_name!r}")
        self._check_config("set_module_name", quantization_config)
        self.module_name_config[module_name] = quantization_config
        return self

    def set_filter_function(self, filter_fn: NodeFilter | None) -> XNNPACKQuantizer:
        """Quantize only patterns whose compute nodes all pass ``filter_fn(node)`` (applied on
        top of every config, and to the qparam sharing that follows)."""
        if filter_fn is not None and not callable(filter_fn):
            raise TypeError(f"set_filter_function: expected a callable or None; got {filter_fn!r}")
        self.filter_fn = filter_fn
        return self

    # -- declarations --------------------------------------------------------------------------

    def quantization_capabilities(self) -> tuple[Capability, ...]:
        config = self.global_config
        if config is None or config.input_activation is None or config.weight is None:
            return ()
        act, weight = config.input_activation, config.weight
        return declared_capabilities(
            is_per_channel=weight.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine),
            is_qat=config.is_qat,
            is_dynamic=act.is_dynamic,
            act_granularity="per_token" if act.per_token else "per_tensor",
            act_qmin=act.quant_min if act.quant_min is not None else -128,
            act_qmax=act.quant_max if act.quant_max is not None else 127,
            weight_qmin=weight.quant_min if weight.quant_min is not None else -128,
            weight_qmax=weight.quant_max if weight.quant_max is not None else 127,
        )

    # -- transform and annotation --------------------------------------------------------------

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Python-number operands of float32 add / mul become 0-d float32 buffers, so they can
        be observed. Returns a new GraphModule (sharing ``model``'s tensors) when anything
        changes; ``model`` itself is never modified."""
        return _scalars_to_buffers(model)

    def _stages(self) -> list[_Stage]:
        names = tuple(self.module_name_config)
        types = frozenset(_type_name(t) for t in self.module_type_config)
        outside = _outside_filter(names, types)
        stages = [
            _Stage(config, _module_name_filter(name), f"module name {name!r}")
            for name, config in self.module_name_config.items()
        ]
        stages += [
            _Stage(config, _module_type_filter(tp), f"module type {tp.__name__}")
            for tp, config in self.module_type_config.items()
        ]
        stages += [
            _Stage(config, outside, f"operator type {op}", operator=op)
            for op, config in self.operator_type_config.items()
        ]
        stages.append(_Stage(self.global_config, outside, "global config"))
        return stages

    def annotate(self, model: GraphModule) -> GraphModule:
        warn_unknown_modules(model, "set_module_name", self.module_name_config, quantizer=self.name)
        warn_unknown_modules(model, "set_module_type", self.module_type_config, quantizer=self.name)
        patterns = _Patterns(model)
        for stage in self._stages():
            if stage.config is None and stage.description == "global config":
                continue  # no global config: nothing else to claim
            for pattern in _PATTERNS:
                if not _applies(pattern, stage.config):
                    continue
                if stage.operator is not None and not any(_op_matches(stage.operator, t) for t in pattern.anchors):
                    continue
                for match in pattern.find(patterns):
                    self._apply(stage, pattern, match)
        self._share_qparams(model)
        self._explain_float(model)
        return model

    def _explain_float(self, model: GraphModule) -> None:
        """A reason on every node of a declared op this quantizer left float without one
        (the annotation report shows it)."""
        dynamic = self._dynamic_only()
        for node in model.graph.nodes:
            if node.op != "call_function" or qw.is_annotated(node) or qw.SKIP_REASON_KEY in node.meta:
                continue
            if self.filter_fn is not None and _calls(node, _FILTERED) and not self.filter_fn(node):
                set_skip_reason(node, "rejected by the filter function")
            elif _calls(node, _SHARE_QPARAMS) and node.args and isinstance(node.args[0], Node):
                set_skip_reason(
                    node,
                    f"input {node.args[0].name!r} has no quantized output: XNNPACK shares qparams through "
                    f"{str(node.target).split('.')[1]} only after a quantized producer",
                )
            elif _calls(node, _CONV | _CONV_T) and dynamic:
                user = _only_user(node)
                if user is not None and _calls(user, _RELU):
                    set_skip_reason(
                        node,
                        "its only user is relu: XNNPACK quantizes conv + relu as one pattern, which a dynamic "
                        "config does not apply",
                    )

    def _dynamic_only(self) -> bool:
        """True when every config this quantizer holds is dynamic."""
        configs = [stage.config for stage in self._stages() if stage.config is not None]
        act = [c.input_activation for c in configs]
        return bool(configs) and all(a is not None and a.is_dynamic for a in act)

    def _apply(self, stage: _Stage, pattern: _Pattern, match: _Match) -> None:
        if qw.is_annotated(match.nodes):
            return
        if stage.operator is not None and not _op_matches(stage.operator, match.anchor.target):
            return
        # a stage selects patterns by their anchor op (the conv, linear, add...); the user's
        # filter function must accept every compute node of the pattern
        if not stage.accepts(match.anchor):
            return
        if self.filter_fn is not None and not all(self.filter_fn(n) for n in match.nodes):
            return
        if stage.config is None:
            mark_annotated(match.nodes)
            for node in match.nodes:
                set_skip_reason(node, f"{stage.description} is configured None ({pattern.name})")
            return
        reason = match.annotate(stage.config)
        if reason is not None:
            set_skip_reason(match.anchor, f"{pattern.name}: {reason}")
            return
        mark_annotated(match.nodes)

    def _share_qparams(self, model: GraphModule) -> None:
        """qparam-sharing ops whose input has output qparams take them (input and output)."""
        user = self.filter_fn
        for node in model.graph.nodes:
            if not _calls(node, _SHARE_QPARAMS) or not node.args or qw.is_annotated(node):
                continue
            producer = node.args[0]
            if not isinstance(producer, Node):
                continue
            annotation = _annotation(producer)
            if annotation is None or annotation.output_qspec is None:
                continue
            if user is not None and not user(node):
                continue
            shared = qw.SharedQuantizationSpec(producer)
            qw.annotate_input_qspec_map(node, producer, shared)
            qw.annotate_output_qspec(node, shared)
            mark_annotated([node])

    def validate(self, model: GraphModule) -> None:
        return None


def _scalars_to_buffers(model: GraphModule) -> GraphModule:
    def scalar(arg: Any) -> bool:
        return isinstance(arg, (int, float)) and not isinstance(arg, bool)

    todo = [
        n.name
        for n in model.graph.nodes
        if _calls(n, _ADD | _MUL) and _is_float32(n) and any(scalar(a) for a in n.args)
    ]
    if not todo:
        return model
    graph = copy.deepcopy(model.graph)  # nodes and meta dicts are new; tensors are not copied
    result = GraphModule(model, graph)
    result.meta.update(model.meta)
    by_name = {n.name: n for n in graph.nodes}
    counter = 0
    for name in todo:
        node = by_name[name]
        args = list(node.args)
        for i, arg in enumerate(args):
            if not scalar(arg):
                continue
            while hasattr(result, f"_xnnpack_scalar_{counter}"):
                counter += 1
            attr = f"_xnnpack_scalar_{counter}"
            value = torch.tensor(float(arg), dtype=torch.float32)
            result.register_buffer(attr, value)
            with graph.inserting_before(node):
                constant = graph.get_attr(attr)
            fake_mode = getattr(node.meta.get("val"), "fake_mode", None)
            constant.meta["val"] = fake_mode.from_tensor(value, static_shapes=True) if fake_mode else value
            args[i] = constant
        node.args = tuple(args)
    result.recompile()
    return result

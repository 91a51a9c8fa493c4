"""X86 Inductor quantizer: the PT2E x86 recipe, matched on aten ops.

The recipe (same semantics as the PT2E/torchao X86InductorQuantizer, so inductor's x86 int8
passes lower the result):

- conv / linear *inputs* are quantized (uint8 per-tensor affine activations, int8
  per-channel symmetric weights); their outputs are not — the next quantized op quantizes
  its own input. Fusion patterns mark their last node as "output of a quantized pattern":
  conv2d + add (+ relu), conv2d / conv1d + unary, linear + add (+ relu), linear + unary;
- conv2d + add: the add's other input is quantized too; linear + add: it is not;
- mul of two same-shape tensors: both inputs quantized;
- max_pool2d, cat, avg_pool2d, adaptive_avg_pool2d, flatten: quantized only when their
  inputs come from quantized patterns; their outputs then share their input's observer;
- matmul: opt-in (``enable_matmul=True`` or ``set_function_type_qconfig(torch.matmul, ...)``);
- QAT (``is_qat=True``): conv2d + batch norm, alone or followed by add (+ relu) or by one of
  the conv activations, is annotated first as one pattern whose last node fake-quantizes
  its output (batch norm stays in the graph while training); ``prepare_qat_pt2e`` and
  ``convert_pt2e`` simulate and then fold the batch norm.

Unlike the peer, patterns are found on the exported aten graph itself (not through source
partitions), so they are found under default non-strict ``torch.export``, with functional
or module activations; standalone conv1d is quantized too. Configs are applied module name
> operator type > global; ``None`` leaves the matched nodes float and records why in
``node.meta[quantweave.plugin_api.SKIP_REASON_KEY]`` (through ``set_skip_reason``).

A conv with a string padding (``padding="valid"``, or ``"same"`` padding both sides alike:
``dilation * (kernel - 1)`` even) is quantized as the conv with explicit padding it equals:
``transform_for_annotation`` rewrites it so (on a new GraphModule), and inductor lowers it
to the same int8 conv. ``"same"`` that pads one side more (an even kernel) stays float,
with a reason: inductor would run it as a float conv between dequantize and quantize.

Every node whose op is in one of x86's patterns and that x86 leaves float gets a reason
too (``set_skip_reason``), read by ``quantweave.annotation_report``: the rule that did not
apply here (pooling whose input is not quantized by an x86 pattern, an activation that
does not follow a conv / linear it can fuse with, a flatten with no quantized consumer, a
mul of differently shaped tensors, matmul not enabled, no config covering the node, an
in-place add / mul...). In-place ops count as their functional op
(``quantweave.capabilities.vocabulary_op``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.capabilities import tensor_quant_from_spec, vocabulary_op
from quantweave.observers import (
    FakeQuantize,
    FusedMovingAvgObsFakeQuantize,
    HistogramObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from quantweave.plugin_api import (
    ANNOTATED_BY_KEY,
    ANNOTATION_KEY,
    SKIP_REASON_KEY,
    Capability,
    is_annotated,
    mark_annotated,
    set_skip_reason,
    warn_unknown_modules,
)

from ._capabilities import declared_capabilities

__all__ = ["X86InductorQuantizer", "declared_capabilities", "get_default_x86_inductor_quantization_config"]

aten = torch.ops.aten
KEY = ANNOTATION_KEY

_CONV2D = aten.conv2d.default
_CONV1D = aten.conv1d.default
_LINEAR = aten.linear.default
#: convs with a string padding ("same" / "valid") -> the conv they are rewritten as
_PADDING_CONVS = {aten.conv1d.padding: _CONV1D, aten.conv2d.padding: _CONV2D}
_ADD = (aten.add.Tensor,)
_RELU = (aten.relu.default, aten.relu_.default)
_CONV_UNARY = (
    *_RELU,
    aten.hardtanh.default,
    aten.hardtanh_.default,
    aten.relu6.default,
    aten.hardswish.default,
    aten.hardswish_.default,
    aten.silu.default,
    aten.silu_.default,
)
_LINEAR_UNARY = (*_RELU, aten.leaky_relu.default, aten.tanh.default, aten.gelu.default)
_PROPAGATE = (
    aten.max_pool2d.default,
    aten.cat.default,
    aten.avg_pool2d.default,
    aten.adaptive_avg_pool2d.default,
    aten.flatten.using_ints,
)
# what the global config quantizes (matmul is opt-in)
_DEFAULT_QUANTIZABLE = frozenset((_CONV1D, _CONV2D, _LINEAR, aten.mul.Tensor, *_PROPAGATE))
_QUANTIZABLE = _DEFAULT_QUANTIZABLE | {aten.matmul.default}

# torch callables / modules accepted by set_function_type_qconfig / set_module_type_qconfig
_OPERATOR_OF: dict[Any, Any] = {
    torch.nn.Conv1d: _CONV1D,
    F.conv1d: _CONV1D,
    torch.nn.Conv2d: _CONV2D,
    F.conv2d: _CONV2D,
    torch.nn.Linear: _LINEAR,
    F.linear: _LINEAR,
    torch.nn.MaxPool2d: aten.max_pool2d.default,
    F.max_pool2d: aten.max_pool2d.default,
    torch.cat: aten.cat.default,
    torch.nn.AvgPool2d: aten.avg_pool2d.default,
    F.avg_pool2d: aten.avg_pool2d.default,
    torch.nn.AdaptiveAvgPool2d: aten.adaptive_avg_pool2d.default,
    F.adaptive_avg_pool2d: aten.adaptive_avg_pool2d.default,
    torch.flatten: aten.flatten.using_ints,
    torch.matmul: aten.matmul.default,
    torch.mul: aten.mul.Tensor,
}


@dataclass
class X86Annotation(qw.QuantizationAnnotation):
    """An annotation that also remembers whether the node ends a quantized pattern."""

    is_output_of_quantized_pattern: bool = False


@functools.lru_cache
def get_default_x86_inductor_quantization_config(
    is_qat: bool = False, is_dynamic: bool = False, reduce_range: bool = False
) -> qw.QuantizationConfig:
    """The x86 recipe: uint8 [0, 255] ([0, 127] with ``reduce_range``) per-tensor affine
    activations (HistogramObserver; PlaceholderObserver when dynamic), int8 [-128, 127]
    per-channel symmetric weights (PerChannelMinMaxObserver), float bias.

    ``is_qat=True``: the same ranges through fake-quantizers (FusedMovingAvgObsFakeQuantize,
    per-channel moving-average weights; dynamic activations: FakeQuantize over a
    MovingAverageMinMaxObserver with averaging constant 1), for ``prepare_qat_pt2e``."""
    for name, value in (("is_qat", is_qat), ("is_dynamic", is_dynamic), ("reduce_range", reduce_range)):
        if not isinstance(value, bool):
            raise TypeError(f"get_default_x86_inductor_quantization_config: {name} must be a bool; got {value!r}")
    act_ctr: Any
    weight_ctr: Any
    if is_qat and is_dynamic:
        act_ctr = FakeQuantize.with_args(
            eps=2**-12, observer=MovingAverageMinMaxObserver.with_args(averaging_constant=1)
        )
    elif is_qat:
        act_ctr = FusedMovingAvgObsFakeQuantize.with_args(eps=2**-12)
    else:
        act_ctr = (PlaceholderObserver if is_dynamic else HistogramObserver).with_args(eps=2**-12)
    if is_qat:
        weight_ctr = FusedMovingAvgObsFakeQuantize.with_args(eps=2**-12, observer=MovingAveragePerChannelMinMaxObserver)
    else:
        weight_ctr = PerChannelMinMaxObserver.with_args(eps=2**-12)
    act = qw.QuantizationSpec(
        dtype=torch.uint8,
        quant_min=0,
        quant_max=127 if reduce_range else 255,
        qscheme=torch.per_tensor_affine,
        is_dynamic=is_dynamic,
        observer_or_fake_quant_ctr=act_ctr,
    )
    weight = qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        observer_or_fake_quant_ctr=weight_ctr,
    )
    return qw.QuantizationConfig(act, act, weight, None, is_qat)


# -- helpers over annotations -----------------------------------------------------------------


def _annotation(node: Node) -> Any:
    return node.meta.get(KEY)


def _ends_quantized_pattern(node: Node) -> bool:
    return is_annotated(node) and bool(getattr(_annotation(node), "is_output_of_quantized_pattern", False))


def _is_float_tensor(arg: Any) -> bool:
    """A float32 graph tensor: quantize_per_tensor rejects float64, and the QAT recipe's
    fused fake-quantizer rejects float16 / bfloat16 (such operands are left float)."""
    if not isinstance(arg, Node):
        return False
    val = arg.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


Filter = Callable[[list[Node]], bool]


def _module_paths(node: Node) -> set[str]:
    return {path for path, _ in node.meta.get("nn_module_stack", {}).values()}


def _module_name_filter(name: str) -> Filter:
    return lambda nodes: all(name in _module_paths(n) for n in nodes)


def _operator_filter(op: Any) -> Filter:
    return lambda nodes: any(n.target == op for n in nodes)


def _global_filter(enable_matmul: bool) -> Filter:
    quantizable = _QUANTIZABLE if enable_matmul else _DEFAULT_QUANTIZABLE
    return lambda nodes: sum(n.target in quantizable for n in nodes) == 1


@dataclass(frozen=True)
class _Stage:
    config: qw.QuantizationConfig | None
    accepts: Filter
    description: str


class X86InductorQuantizer(qw.Quantizer):
    """x86 recipe for inductor. Usable as built: the global config is the default recipe.

    ``is_dynamic``: dynamic activations (choose_qparams at run time);
    ``reduce_range``: activations in [0, 127] (CPUs without VNNI);
    ``enable_matmul``: also quantize activation x activation matmuls;
    ``is_qat``: fake-quantize for ``prepare_qat_pt2e`` (conv + batch norm patterns are
    annotated whole; ``convert_pt2e`` folds the batch norm).
    """

    name = "x86"

    def __init__(
        self, is_dynamic: bool = False, reduce_range: bool = False, enable_matmul: bool = False, is_qat: bool = False
    ) -> None:
        for option, value in (
            ("is_dynamic", is_dynamic),
            ("is_qat", is_qat),
            ("reduce_range", reduce_range),
            ("enable_matmul", enable_matmul),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"X86InductorQuantizer: {option} must be a bool; got {value!r}")
        self.enable_matmul = enable_matmul
        self.reduce_range = reduce_range
        self.global_config: qw.QuantizationConfig | None = get_default_x86_inductor_quantization_config(
            is_qat=is_qat, is_dynamic=is_dynamic, reduce_range=reduce_range
        )
        self.operator_type_qconfig: dict[Any, qw.QuantizationConfig | None] = {}
        self.module_name_qconfig: dict[str, qw.QuantizationConfig | None] = {}

    # -- configuration ---------------------------------------------------------------------------

    def _check_mode(self, setter: str, config: qw.QuantizationConfig | None, replacing: object = None) -> None:
        if config is None:
            return
        if not isinstance(config, qw.QuantizationConfig):
            raise TypeError(f"{setter}: expected a quantweave.QuantizationConfig or None; got {type(config).__name__}")
        others: list[tuple[str, qw.QuantizationConfig]] = []
        if self.global_config is not None and replacing != "global":
            others.append(("set_global", self.global_config))
        others += [(f"set_module_name_qconfig({n!r})", c) for n, c in self.module_name_qconfig.items() if c is not None]
        others += [(f"operator {op}", c) for op, c in self.operator_type_qconfig.items() if c is not None]
        for where, other in others:
            if where == replacing:
                continue
            if other.is_qat != config.is_qat:
                raise ValueError(
                    f"{setter}: mixing QAT and post-training configs is not supported; this config has "
                    f"is_qat={config.is_qat}, {where} has is_qat={other.is_qat}"
                )
            mine, theirs = _is_dynamic(config), _is_dynamic(other)
            if mine is not None and theirs is not None and mine != theirs:
                raise ValueError(
                    f"{setter}: mixing static and dynamic configs is not supported; this config has "
                    f"is_dynamic={mine}, {where} has is_dynamic={theirs}"
                )

    def set_global(self, quantization_config: qw.QuantizationConfig | None) -> X86InductorQuantizer:
        """The config for everything not matched by a module name or operator type config."""
        self._check_mode("set_global", quantization_config, replacing="global")
        self.global_config = quantization_config
        return self

    def get_global_quantization_config(self) -> qw.QuantizationConfig | None:
        return self.global_config

    def set_function_type_qconfig(
        self, function_type: Callable[..., Any], quantization_config: qw.QuantizationConfig | None
    ) -> X86InductorQuantizer:
        """Config for one operator, named by a torch function (``torch.matmul``, ``F.linear``...)."""
        return self._set_operator("set_function_type_qconfig", function_type, quantization_config)

    def set_module_type_qconfig(
        self, module_type: type[torch.nn.Module], quantization_config: qw.QuantizationConfig | None
    ) -> X86InductorQuantizer:
        """Config for one operator, named by its module type (``torch.nn.Linear``...)."""
        return self._set_operator("set_module_type_qconfig", module_type, quantization_config)

    def _set_operator(self, setter: str, key: Any, config: qw.QuantizationConfig | None) -> X86InductorQuantizer:
        op = _OPERATOR_OF.get(key)
        if op is None:
            supported = ", ".join(sorted({getattr(k, "__name__", str(k)) for k in _OPERATOR_OF}))
            raise ValueError(f"{setter}: {key!r} is not an operator the x86 quantizer handles; supported: {supported}")
        self._check_mode(setter, config, replacing=f"operator {op}")
        self.operator_type_qconfig[op] = config
        return self

    def set_module_name_qconfig(
        self, module_name: str, quantization_config: qw.QuantizationConfig | None
    ) -> X86InductorQuantizer:
        """Config for every supported pattern inside the submodule ``module_name`` (e.g. ``"layers.0"``)."""
        if not isinstance(module_name, str) or not module_name:
            raise ValueError(f"set_module_name_qconfig: module_name must be a non-empty str; got {module_name!r}")
        self._check_mode(
            "set_module_name_qconfig", quantization_config, replacing=f"set_module_name_qconfig({module_name!r})"
        )
        self.module_name_qconfig[module_name] = quantization_config
        return self

    # -- declarations ------------------------------------------------------------------------------

    def quantization_capabilities(self) -> tuple[Capability, ...]:
        if self.global_config is None:
            return ()
        return declared_capabilities(
            is_dynamic=bool(_is_dynamic(self.global_config)),
            reduce_range=self.reduce_range,
            enable_matmul=self.enable_matmul,
            is_qat=self.global_config.is_qat,
        )

    # -- transform and annotation ------------------------------------------------------------------

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """A conv1d / conv2d with ``padding="valid"``, or ``"same"`` padding both sides alike,
        becomes the conv with explicit padding it equals (x86's patterns, and inductor's int8
        conv, take it so). Returns a new GraphModule (sharing ``model``'s tensors) when
        anything changes; ``model`` itself is never modified."""
        return _explicit_padding_convs(model)

    # -- annotation --------------------------------------------------------------------------------

    def _stages(self) -> list[_Stage]:
        stages = [
            _Stage(config, _module_name_filter(name), f"module name {name!r}")
            for name, config in self.module_name_qconfig.items()
        ]
        stages += [
            _Stage(config, _operator_filter(op), f"operator type {op}")
            for op, config in self.operator_type_qconfig.items()
        ]
        if self.global_config is not None:
            stages.append(_Stage(self.global_config, _global_filter(self.enable_matmul), "global config"))
        return stages

    def _is_qat(self) -> bool:
        configs = [self.global_config, *self.module_name_qconfig.values(), *self.operator_type_qconfig.values()]
        return any(c is not None and c.is_qat for c in configs)

    def annotate(self, model: GraphModule) -> GraphModule:
        warn_unknown_modules(model, "set_module_name_qconfig", self.module_name_qconfig, quantizer=self.name)
        qat = self._is_qat()
        for stage in self._stages():
            matmul = self.enable_matmul or stage.description != "global config"
            _StageAnnotator(stage, matmul=matmul, qat=qat).run(model)
        _share_outputs_of_int8_in_int8_out(model)
        self._explain_float(model)
        return model

    def __repr__(self) -> str:
        parts = [f"name={self.name!r}", f"global={_describe_config(self.global_config)}"]
        parts += [f"reduce_range={self.reduce_range}", f"enable_matmul={self.enable_matmul}"]
        if self.module_name_qconfig:
            names = ", ".join(f"{n!r}: {_describe_config(c)}" for n, c in self.module_name_qconfig.items())
            parts.append(f"module_name={{{names}}}")
        if self.operator_type_qconfig:
            ops = ", ".join(f"{op}: {_describe_config(c)}" for op, c in self.operator_type_qconfig.items())
            parts.append(f"operator_type={{{ops}}}")
        return f"{type(self).__name__}({', '.join(parts)})"

    # -- why nodes stay float ------------------------------------------------------------------

    def _explain_float(self, model: GraphModule) -> None:
        """Record, through the public protocol (``set_skip_reason``), why each node whose op
        belongs to one of x86's patterns stayed float. A reason another quantizer (an earlier
        member of a composition) already recorded is kept."""
        for node in model.graph.nodes:
            if node.op != "call_function" or is_annotated(node):
                continue
            if vocabulary_op(str(node.target)) not in _EXPLAINED_OPS:
                continue
            if isinstance(node.meta.get(SKIP_REASON_KEY), str):
                continue
            set_skip_reason(node, self._why_float(node))

    def _covering_config(self, node: Node) -> tuple[bool, str]:
        """(a config applies to ``node``, which one): module name > operator type > global."""
        for name, config in self.module_name_qconfig.items():
            if name in _module_paths(node):
                return config is not None, f"module name {name!r}"
        if node.target in self.operator_type_qconfig:
            return self.operator_type_qconfig[node.target] is not None, f"operator type {node.target}"
        return self.global_config is not None, "global config"

    def _why_float(self, node: Node) -> str:
        op = _short(node)
        target = node.target
        if target in _PADDING_CONVS:
            return _why_padding_conv_float(node)
        if target == aten.matmul.default and not self.enable_matmul and target not in self.operator_type_qconfig:
            return (
                "matmul is opt-in: X86InductorQuantizer(enable_matmul=True) or "
                "set_function_type_qconfig(torch.matmul, config)"
            )
        applies, which = self._covering_config(node)
        if not applies and target in _QUANTIZABLE:
            if which == "global config":
                return "no x86 config covers it (the global config is None, no module name or operator config matches)"
            return f"{which} configured None"
        if target in _WEIGHTED_OPS:
            return f"{op} was not matched by an x86 pattern (its input or weight is not a graph tensor)"
        if target in _ADD:
            return _why_add_float(node)
        if target in _FUSES_AFTER:
            producers, patterns = _FUSES_AFTER[target]
            return _why_fused_float(node, producers, f"{op} is quantized by x86 only fused after {patterns}")
        if target in (aten.mul.Tensor, aten.matmul.default):
            return _why_two_inputs_float(node)
        functional = vocabulary_op(str(target))
        if functional != str(target) and target not in _IN_PLACE_MATCHED:
            return (
                f"{op} is in place: x86 quantizes {functional.split('.')[1]} only as the functional op "
                f"({functional}); write it out of place (x = x + y, not x += y) to have it quantized"
            )
        if target == aten.cat.default:
            for i in node.all_input_nodes:
                if not _ends_quantized_pattern(i):
                    return (
                        "cat is quantized by x86 only when every input is the output of a quantized x86 pattern; "
                        f"here {_what_is(i)}"
                    )
        if target == aten.flatten.using_ints and node.users and not any(u.target in _QUANTIZABLE for u in node.users):
            return (
                "not followed by a quantized consumer (x86 quantizes flatten only when a conv / linear / mul uses it)"
            )
        if target in _PROPAGATE and node.all_input_nodes:
            first = node.all_input_nodes[0]
            if not _ends_quantized_pattern(first):
                return (
                    f"input is not quantized by an x86 pattern ({op} is quantized only when its input is): "
                    f"{_what_is(first)}"
                )
        if not applies:
            return "no x86 config covers it (the global config is None, no module name or operator config matches)"
        return f"{op} was not matched by an x86 pattern here"


def _is_dynamic(config: qw.QuantizationConfig) -> bool | None:
    act = config.input_activation
    return None if act is None else bool(act.is_dynamic)


def _config_key(value: Any) -> Any:
    """A comparable form of a config: observer constructors (``.with_args`` partials, which
    compare by identity) as their class and arguments."""
    if isinstance(value, qw.QuantizationConfig):
        return tuple(
            _config_key(getattr(value, f)) for f in ("input_activation", "output_activation", "weight", "bias")
        )
    if isinstance(value, qw.QuantizationSpec):
        return (
            value.dtype,
            value.quant_min,
            value.quant_max,
            value.qscheme,
            value.ch_axis,
            value.is_dynamic,
            _config_key(value.observer_or_fake_quant_ctr),
        )
    partial = getattr(value, "p", None)
    if isinstance(partial, functools.partial):
        return (partial.func, tuple(sorted((k, _config_key(v)) for k, v in partial.keywords.items())))
    return value


def _describe_config(config: qw.QuantizationConfig | None) -> str:
    """A config as a person reads it: the default recipe by its options, else its tensors."""
    if config is None:
        return "None"
    for is_qat in (False, True):
        for is_dynamic in (False, True):
            for reduce_range in (False, True):
                default = get_default_x86_inductor_quantization_config(
                    is_qat=is_qat, is_dynamic=is_dynamic, reduce_range=reduce_range
                )
                if config is default or _config_key(config) == _config_key(default):
                    mode = "qat" if is_qat else "dynamic" if is_dynamic else "static"
                    return f"default({mode}{', reduce_range' if reduce_range else ''})"
    act = tensor_quant_from_spec(config.input_activation)
    weight = tensor_quant_from_spec(config.weight)
    dynamic = ", dynamic" if _is_dynamic(config) else ""
    qat = ", qat" if config.is_qat else ""
    return f"QuantizationConfig(activation={act}, weight={weight}{dynamic}{qat})"


# -- why a node stayed float ----------------------------------------------------------------------

_WEIGHTED_OPS = (_CONV1D, _CONV2D, _LINEAR)
# activations (and batch norm) x86 quantizes only fused after a producer: op -> (producers, in words)
_FUSES_AFTER: dict[Any, tuple[tuple[Any, ...], str]] = {
    **dict.fromkeys(_RELU, ((_CONV1D, _CONV2D, _LINEAR, *_ADD), "conv1d, conv2d, linear, or their add")),
    **dict.fromkeys(tuple(t for t in _CONV_UNARY if t not in _RELU), ((_CONV2D,), "conv2d")),
    **dict.fromkeys((aten.leaky_relu.default, aten.tanh.default, aten.gelu.default), ((_LINEAR,), "linear")),
    aten.batch_norm.default: ((_CONV2D,), "conv2d (QAT; in post-training batch norm is folded into the conv)"),
}
# in-place ops x86 matches as their functional op (fused after a conv / linear)
_IN_PLACE_MATCHED = frozenset((*_RELU, *_CONV_UNARY, *_LINEAR_UNARY))
# every op of a pattern x86 can declare (in-place ops count as their functional op)
_EXPLAINED_OPS = frozenset(
    op for cap in declared_capabilities(is_qat=True, enable_matmul=True) for op in cap.ops
) | frozenset(str(t) for t in (*_RELU, *_CONV_UNARY, *_LINEAR_UNARY))


def _short(node: Node) -> str:
    parts = str(node.target).split(".")
    return parts[1] if len(parts) == 3 else str(node.target)


def _named(node: Node) -> str:
    """``relu_3 (relu)``, or just ``sigmoid`` when the node is named after its op."""
    if node.op != "call_function":
        return f"{node.name} ({node.op})"
    short = _short(node)
    return node.name if node.name == short else f"{node.name} ({short})"


def _what_is(node: Node) -> str:
    """What ``node`` is, for a reason: float, or quantized by someone other than x86."""
    annotation = _annotation(node)
    if node.op == "placeholder":
        return f"{node.name} is a float model input"
    if node.op != "call_function":
        return f"{_named(node)} is float"
    if is_annotated(node) and not isinstance(annotation, X86Annotation):
        by = node.meta.get(ANNOTATED_BY_KEY)
        return f"{_named(node)} was annotated by another quantizer" + (f" ({by})" if isinstance(by, str) else "")
    if is_annotated(node) and _ends_quantized_pattern(node):
        return f"{_named(node)} already ends an x86 pattern of its own"
    if is_annotated(node):
        return f"{_named(node)} is inside an x86 pattern but does not end it"
    return f"{_named(node)} is float"


def _why_fused_float(node: Node, producers: tuple[Any, ...], rule: str) -> str:
    first = node.args[0] if node.args else None
    if not isinstance(first, Node):
        return f"{rule}; its input is not a graph tensor"
    if first.target in _PADDING_CONVS and _padding_of(first) is None:
        return f"{rule}; here it follows {_named(first)}, which stays float: {_why_padding_conv_float(first)}"
    if first.target not in producers:
        return f"{rule}; here it follows {_named(first)}"
    if len(first.users) > 1:
        return f"{rule}; its input {_named(first)} has other users, so they cannot be fused"
    return f"{rule}; its input {_what_is(first)}"


def _why_add_float(node: Node) -> str:
    rule = "add is quantized by x86 only fused after a conv2d or linear whose only user it is (conv2d_add, linear_add)"
    inputs = [a for a in node.args[:2] if isinstance(a, Node)]
    fusable = [a for a in inputs if a.target in (_CONV2D, _LINEAR, aten.batch_norm.default)]
    if len(inputs) < 2:
        return f"{rule}; here one operand is not a tensor"
    if not fusable:
        return f"{rule}; neither input is a conv2d or linear"
    producer = fusable[0]
    if inputs[0] is inputs[1]:
        return f"{rule}; here both operands are {_named(producer)} (x + x), which cannot be fused"
    if len(producer.users) > 1:
        return f"{rule}; its input {_named(producer)} has other users, so they cannot be fused"
    return f"{rule}; its input {_what_is(producer)}"


def _padding_of(node: Node) -> list[int] | None:
    """The explicit padding of the conv that equals ``node`` (a conv with a string padding),
    or None when there is none: ``"same"`` with an odd ``dilation * (kernel - 1)`` pads one
    side more than the other (torch pads the extra element at the end)."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    given: dict[str, Any] = {**dict(zip(names, node.args, strict=False)), **node.kwargs}
    weight = given.get("weight")
    val = weight.meta.get("val") if isinstance(weight, Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    kernel = list(val.shape[2:])
    padding = given.get("padding", "valid")
    if padding == "valid":
        return [0] * len(kernel)
    if padding != "same":
        return None
    dilation = given.get("dilation", 1)
    dilations = [dilation] * len(kernel) if isinstance(dilation, int) else list(dilation)
    totals = [d * (k - 1) for d, k in zip(dilations, kernel, strict=True)]
    if any(not isinstance(t, int) or t % 2 for t in totals):
        return None
    return [t // 2 for t in totals]


def _explicit_padding_convs(model: GraphModule) -> GraphModule:
    todo = [
        n.name
        for n in model.graph.nodes
        if n.op == "call_function" and n.target in _PADDING_CONVS and _padding_of(n) is not None
    ]
    if not todo:
        return model
    graph = copy.deepcopy(model.graph)  # nodes and meta dicts are new; tensors are not copied
    result = GraphModule(model, graph)
    result.meta.update(model.meta)
    by_name = {n.name: n for n in graph.nodes}
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    defaults: dict[str, Any] = {"bias": None, "stride": 1, "dilation": 1, "groups": 1}
    for name in todo:
        node = by_name[name]
        given: dict[str, Any] = {**defaults, **dict(zip(names, node.args, strict=False)), **node.kwargs}
        padding = _padding_of(node)
        assert padding is not None
        for key in ("stride", "dilation"):  # the .default overloads take one int per dimension
            if isinstance(given[key], int):
                given[key] = [given[key]] * len(padding)
        given["padding"] = padding
        node.target = _PADDING_CONVS[node.target]
        node.args = tuple(given[n] for n in names)
        node.kwargs = {}
    result.recompile()
    return result


def _why_padding_conv_float(node: Node) -> str:
    op = _short(node)
    if _padding_of(node) is None:
        return (
            f"{op} with padding='same' pads one side more than the other here (dilation * (kernel - 1) is odd): "
            "x86 quantizes a conv whose padding is the same on both sides (inductor would run this one as a float "
            "conv between dequantize and quantize)"
        )
    return (
        f"{op} with a string padding is quantized once X86InductorQuantizer.transform_for_annotation has written "
        "it as the conv with explicit padding it equals (prepare_pt2e calls it); this graph was annotated without it"
    )


def _why_two_inputs_float(node: Node) -> str:
    op = _short(node)
    if len(node.args) != 2 or not all(_is_float_tensor(a) for a in node.args):
        dtypes = [getattr(getattr(a, "meta", {}).get("val"), "dtype", None) for a in node.args[:2]]
        other = next((d for d in dtypes if isinstance(d, torch.dtype) and d != torch.float32), None)
        if other is not None:
            return f"{op} is quantized by x86 only between float32 tensors; here an operand is {other}"
        return f"{op} is quantized by x86 only between two tensors; here an operand is a scalar or constant"
    a, b = node.args
    assert isinstance(a, Node) and isinstance(b, Node)
    if node.target == aten.mul.Tensor and a.meta["val"].shape != b.meta["val"].shape:
        return f"mul is quantized by x86 only for inputs of the same shape; here {tuple(a.meta['val'].shape)} " + (
            f"x {tuple(b.meta['val'].shape)} (broadcast)"
        )
    return f"{op} was not matched by an x86 pattern here"


class _StageAnnotator:
    """Annotates one configuration stage over the whole graph, in the recipe's order."""

    def __init__(self, stage: _Stage, matmul: bool, qat: bool = False) -> None:
        self.stage = stage
        self.matmul = matmul
        self.qat = qat
        config = stage.config
        self.act = None if config is None else config.input_activation
        self.weight = None if config is None else config.weight
        self.bias = None if config is None else config.bias

    def claim(self, nodes: list[Node]) -> bool:
        """True when these nodes are free and this stage applies to them; a None config
        marks them float (later stages then skip them) and returns False."""
        if is_annotated(nodes) or not self.stage.accepts(nodes):
            return False
        if self.stage.config is None:
            for node in nodes:
                node.meta[KEY] = X86Annotation()
                mark_annotated(node)
                set_skip_reason(node, f"{self.stage.description} configured None")
            return False
        return True

    def run(self, gm: GraphModule) -> None:
        nodes = list(gm.graph.nodes)
        if self.qat:
            self.conv_bn(nodes)
        for with_relu in (True, False):
            self.binary(nodes, (_CONV2D,), with_relu, quantize_other=True)
        self.unary(nodes, {_CONV2D: _CONV_UNARY, _CONV1D: _RELU})
        self.standalone(nodes, (_CONV2D, _CONV1D))
        for with_relu in (True, False):
            self.binary(nodes, (_LINEAR,), with_relu, quantize_other=False)
        self.unary(nodes, {_LINEAR: _LINEAR_UNARY})
        self.standalone(nodes, (_LINEAR,))
        if self.matmul:
            self.two_inputs(nodes, aten.matmul.default, same_shape=False)
        self.two_inputs(nodes, aten.mul.Tensor, same_shape=True)
        for node in nodes:
            self.propagate(node)

    # weighted ops

    def weighted(self, node: Node, ends_pattern: bool) -> None:
        x, weight = node.args[0], node.args[1]
        input_map: dict[Node, Any] = {}
        if isinstance(x, Node):
            input_map[x] = self.act
        if isinstance(weight, Node):
            input_map[weight] = self.weight
        bias = node.args[2] if len(node.args) > 2 else None
        if isinstance(bias, Node):
            input_map[bias] = self.bias
        node.meta[KEY] = X86Annotation(input_qspec_map=input_map, is_output_of_quantized_pattern=ends_pattern)
        mark_annotated(node)

    def mark(
        self, node: Node, input_map: dict[Node, Any] | None = None, ends_pattern: bool = True, output: bool = False
    ) -> None:
        node.meta[KEY] = X86Annotation(
            input_qspec_map=input_map or {},
            output_qspec=self.act if output else None,
            is_output_of_quantized_pattern=ends_pattern,
        )
        mark_annotated(node)

    @staticmethod
    def binary_partner(producer: Node) -> tuple[Node, Node] | None:
        """(add, other input) when ``producer``'s only user is an add of two tensors."""
        if len(producer.users) != 1:
            return None
        (add,) = producer.users
        if add.op != "call_function" or add.target not in _ADD or len(add.args) < 2:
            return None
        if add.args[0] is producer:
            other = add.args[1]
        elif add.args[1] is producer:
            other = add.args[0]
        else:
            return None
        # x + x: the fused op cannot take its own output as the other operand
        return (add, other) if isinstance(other, Node) and other is not producer else None

    @staticmethod
    def first_user(node: Node, targets: Iterable[Any]) -> Node | None:
        targets = tuple(targets)
        return next((u for u in node.users if u.op == "call_function" and u.target in targets), None)

    def binary(self, nodes: list[Node], targets: tuple[Any, ...], with_relu: bool, quantize_other: bool) -> None:
        """conv/linear whose only user is an add (+ relu). The recipe quantizes the add's other
        input for conv (``quantize_other``) and leaves it float for linear."""
        for producer in nodes:
            if producer.target not in targets:
                continue
            match = self.binary_partner(producer)
            if match is None:
                continue
            add, other = match
            relu = self.first_user(add, _RELU) if with_relu else None
            if with_relu and relu is None:
                continue
            pattern = [producer, add] + ([relu] if relu is not None else [])
            if not self.claim(pattern):
                continue
            self.weighted(producer, ends_pattern=False)
            self.mark(add, {other: self.act} if quantize_other else {}, ends_pattern=relu is None)
            if relu is not None:
                self.mark(relu)

    def conv_bn(self, nodes: list[Node]) -> None:
        """QAT: conv2d -> batch norm, then add (+ relu), an activation, or nothing; in that
        order over the graph. The pattern's last node quantizes its output (the batch norm
        stays in the graph while training, so the next op's input is not the conv's)."""
        for kind in ("add_relu", "add", "unary", "alone"):
            for conv in nodes:
                if conv.target != _CONV2D or len(conv.users) != 1:
                    continue
                (bn,) = conv.users
                if bn.target != aten.batch_norm.default or bn.args[0] is not conv:
                    continue
                if kind in ("add_relu", "add"):
                    match = self.binary_partner(bn)
                    if match is None:
                        continue
                    add, other = match
                    relu = self.first_user(add, _RELU) if kind == "add_relu" else None
                    if kind == "add_relu" and relu is None:
                        continue
                    if not self.claim([conv, bn, add] + ([relu] if relu is not None else [])):
                        continue
                    self.weighted(conv, ends_pattern=False)
                    self.mark(bn, ends_pattern=False)
                    self.mark(add, {other: self.act}, ends_pattern=relu is None, output=relu is None)
                    if relu is not None:
                        self.mark(relu, output=True)
                elif kind == "unary":
                    activation = self.first_user(bn, _CONV_UNARY)
                    if activation is None or not self.claim([conv, bn, activation]):
                        continue
                    self.weighted(conv, ends_pattern=False)
                    self.mark(bn, ends_pattern=False)
                    self.mark(activation, output=True)
                elif self.claim([conv, bn]):
                    self.weighted(conv, ends_pattern=False)
                    self.mark(bn, output=True)

    def unary(self, nodes: list[Node], unaries: dict[Any, tuple[Any, ...]]) -> None:
        """conv/linear followed by an activation it can fuse (``unaries``: op -> activations)."""
        for producer in nodes:
            if producer.target not in unaries:
                continue
            activation = self.first_user(producer, unaries[producer.target])
            if activation is None or not self.claim([producer, activation]):
                continue
            self.weighted(producer, ends_pattern=False)
            self.mark(activation)

    def standalone(self, nodes: list[Node], targets: tuple[Any, ...]) -> None:
        for node in nodes:
            if node.target in targets and self.claim([node]):
                self.weighted(node, ends_pattern=True)

    def two_inputs(self, nodes: list[Node], target: Any, same_shape: bool) -> None:
        for node in nodes:
            if node.target != target or len(node.args) != 2:
                continue
            a, b = node.args
            if not (_is_float_tensor(a) and _is_float_tensor(b)):
                continue
            assert isinstance(a, Node) and isinstance(b, Node)
            if same_shape and a.meta["val"].shape != b.meta["val"].shape:
                continue
            if self.claim([node]):
                self.mark(node, {a: self.act, b: self.act})

    def propagate(self, node: Node) -> None:
        if node.op != "call_function" or node.target not in _PROPAGATE or is_annotated(node):
            return
        inputs = node.all_input_nodes
        if not inputs:
            return
        if node.target == aten.cat.default:
            if not all(_ends_quantized_pattern(i) for i in inputs):
                return
        else:
            if (
                node.target == aten.flatten.using_ints
                and node.users
                and not any(u.target in _QUANTIZABLE for u in node.users)
            ):
                return  # nothing quantized consumes the flattened tensor
            if not _ends_quantized_pattern(inputs[0]):
                return
        if not self.claim([node]):
            return
        if node.target == aten.cat.default:
            first = inputs[0]
            shared = qw.SharedQuantizationSpec((first, node))
            input_map: dict[Node, Any] = {first: self.act}
            input_map.update({other: shared for other in inputs[1:]})
            self.mark(node, input_map)
        else:
            self.mark(node, {inputs[0]: self.act})


def _share_outputs_of_int8_in_int8_out(gm: GraphModule) -> None:
    """Propagated ops produce int8 from int8: their output shares their input's observer."""
    for node in gm.graph.nodes:
        if node.target in _PROPAGATE and _ends_quantized_pattern(node) and node.all_input_nodes:
            _annotation(node).output_qspec = qw.SharedQuantizationSpec((node.all_input_nodes[0], node))

"""Annotation of one graph with ONNX Runtime's recipe (the op tables of :mod:`._ops`): static,
QAT (plus conv + batch norm) and dynamic; each op with the recipe of the config covering it."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import Node

import quantweave as qw
from quantweave import authoring, plugin_api
from quantweave.authoring import ConfigStage, ConfigStages, calls, is_float_tensor, only_user
from quantweave.plugin_api import is_annotated, mark_annotated, set_skip_reason

from ._config import Recipe
from ._ops import (
    _AVERAGING,
    _BATCH_NORM,
    _BINARY,
    _CAT,
    _MATMUL,
    _RELU,
    _SHARED,
    _SPLIT,
    _TRANSPOSED,
    _UNARY_OWN,
    _WEIGHTED,
    aten,
)


def _is_float32(arg: Any) -> bool:
    return is_float_tensor(arg)


def _has_output_qparams(node: Node) -> bool:
    annotation = node.meta.get(plugin_api.ANNOTATION_KEY)
    return annotation is not None and getattr(annotation, "output_qspec", None) is not None


def _split_source(arg: Any) -> Node | None:
    """For ``getitem(split(x), i)`` where this recipe quantized the split: ``x``."""
    if not (isinstance(arg, Node) and arg.op == "call_function" and arg.target is operator.getitem):
        return None
    split = arg.args[0]
    if not (isinstance(split, Node) and split.target in _SPLIT and is_annotated(split)):
        return None
    annotation = split.meta.get(plugin_api.ANNOTATION_KEY)
    source = split.args[0]
    if annotation is None or not isinstance(source, Node) or source not in annotation.input_qspec_map:
        return None
    return source


def _only_user(node: Node, targets: tuple[Any, ...]) -> Node | None:
    user = only_user(node)
    if user is not None and calls(user, targets) and user.args and user.args[0] is node:
        return user
    return None


class _Annotator:
    """Annotates one graph: each op with the recipe of the config that covers it."""

    def __init__(self, stages: ConfigStages, recipe: Any) -> None:
        self.stages = stages
        self._make_recipe = recipe
        self._covering: dict[Node, ConfigStage] = {}
        self._constant: dict[Node, bool] = {}

    def covering(self, node: Node) -> ConfigStage:
        stage = self._covering.get(node)
        if stage is None:
            stage = self._covering[node] = self.stages.covering(node)
        return stage

    def recipe_for(self, node: Node) -> Recipe | None:
        """The recipe covering ``node``; None when its config is None (a config of None set by
        module name, module type or operator type claims the node and says why; a global
        config of None leaves it to other quantizers)."""
        stage = self.covering(node)
        if stage.config is None:
            if stage.kind != "global":
                mark_annotated(node)
                set_skip_reason(node, f"{stage.description} is configured None")
            return None
        recipe: Recipe = self._make_recipe(stage.config)
        return recipe

    def joins(self, node: Node, follower: Node) -> bool:
        """Whether ``follower`` (an activation after ``node``) may be folded into ``node``'s
        unit: ``node``'s config decides the unit (as the other plugins' anchors do), unless the
        follower lies in a module with a config of its own (then it is that module's)."""
        mine, theirs = self.covering(node), self.covering(follower)
        if theirs.kind in ("module_name", "module_type"):
            return (mine.kind, mine.key) == (theirs.kind, theirs.key)
        return True

    def folded(self, node: Node, targets: tuple[Any, ...], recipe: Recipe) -> Node | None:
        """The activation folded into ``node``'s output range, if any."""
        if not recipe.fold_activations:
            return None
        activation = _only_user(node, targets)
        if activation is None or is_annotated(activation) or not self.joins(node, activation):
            return None
        return activation

    def is_constant(self, arg: Any) -> bool:
        """Whether ``arg`` is computed from parameters / buffers only (a get_attr, or ops whose
        every tensor input is constant, e.g. a weight's transpose)."""
        if not isinstance(arg, Node):
            return False
        known = self._constant.get(arg)
        if known is None:
            if arg.op == "get_attr":
                known = True
            elif arg.op == "call_function":
                inputs = arg.all_input_nodes
                known = bool(inputs) and all(self.is_constant(i) for i in inputs)
            else:
                known = False
            self._constant[arg] = known
        return known

    def matmul_wanted(self, node: Node, recipe: Recipe) -> bool:
        """False (the matmul stays float, with the reason) when the recipe quantizes only
        matmuls with a constant second operand (ORT's MatMulConstBOnly) and this one's is computed."""
        if not recipe.matmul_const_b_only or self.is_constant(node.args[1] if len(node.args) > 1 else None):
            return True
        b = node.args[1]
        where = f"'{b.name}'" if isinstance(b, Node) else "its second operand"
        set_skip_reason(
            node,
            f"matmul: its second operand {where} is not a constant and matmul_const_b_only is on (ORT's "
            "MatMulConstBOnly, quantize_dynamic's default: activation x activation matmuls stay float; "
            "matmul_const_b_only=False quantizes them)",
        )
        return False

    # -- static / QAT ----------------------------------------------------------------------------

    def static(self, node: Node, recipe: Recipe) -> None:
        target = node.target
        if target in _WEIGHTED:
            self.weighted(node, recipe)
        elif target in _BINARY:
            self.two_inputs(node, self.folded(node, _RELU, recipe) or node, recipe)
        elif target in _MATMUL:
            if self.matmul_wanted(node, recipe):
                self.two_inputs(node, node, recipe)
        elif target in _CAT:
            self.cat(node, recipe)
        elif target in _SHARED:
            self.shared(node)
        elif target in _AVERAGING:
            self.averaging(node, recipe)
        elif target in _UNARY_OWN:
            self.unary_own(node, recipe)
        elif target in _SPLIT:
            self.split(node)

    def conv_bn(self, conv: Node, recipe: Recipe) -> None:
        """QAT: conv2d -> batch norm (-> relu / clip): conv's input and weight, the last op's output."""
        if conv.target not in (aten.conv2d.default, aten.conv2d.padding):
            return
        bn = _only_user(conv, (_BATCH_NORM,))
        x, weight = conv.args[0], conv.args[1] if len(conv.args) > 1 else None
        if bn is None or is_annotated(bn) or not _is_float32(x) or not isinstance(weight, Node):
            return
        assert isinstance(x, Node)
        activation = self.folded(bn, _WEIGHTED[conv.target], recipe)
        authoring.annotate_input_qspec_map(conv, x, _input_spec(x, recipe))
        authoring.annotate_input_qspec_map(conv, weight, recipe.weights[0])
        last = activation or bn
        authoring.annotate_output_qspec(last, recipe.act)
        mark_annotated([conv, bn] + ([activation] if activation is not None else []))

    def weighted(self, node: Node, recipe: Recipe) -> None:
        x = node.args[0]
        weight = node.args[1] if len(node.args) > 1 else None
        if not _is_float32(x) or not isinstance(weight, Node):
            return
        assert isinstance(x, Node)
        activation = self.folded(node, _WEIGHTED[node.target], recipe)
        axis = 1 if node.target in _TRANSPOSED else 0
        authoring.annotate_input_qspec_map(node, x, _input_spec(x, recipe))
        authoring.annotate_input_qspec_map(node, weight, recipe.weights[axis])
        bias = node.args[2] if len(node.args) > 2 else None
        if recipe.int32_bias and isinstance(bias, Node) and _int32_bias_fits(node, x):
            authoring.annotate_input_qspec_map(node, bias, recipe.bias_spec(node, x, weight))
        if activation is None:
            authoring.annotate_output_qspec(node, recipe.act)
            mark_annotated(node)
        else:
            authoring.annotate_output_qspec(activation, recipe.act)
            mark_annotated([node, activation])

    def two_inputs(self, node: Node, last: Node, recipe: Recipe) -> None:
        if len(node.args) < 2 or not all(_is_float32(a) for a in node.args[:2]):
            return
        for arg in node.args[:2]:
            assert isinstance(arg, Node)
            authoring.annotate_input_qspec_map(node, arg, _input_spec(arg, recipe))
        authoring.annotate_output_qspec(last, recipe.act)
        mark_annotated([node] if last is node else [node, last])

    def cat(self, node: Node, recipe: Recipe) -> None:
        tensors = node.args[0] if node.args else None
        if not isinstance(tensors, (list, tuple)) or not tensors or not all(_is_float32(t) for t in tensors):
            return
        inputs: list[Node] = list(tensors)
        # one range for every input and the output, owned by the first quantized input
        owner = next((i for i in inputs if _has_output_qparams(i)), inputs[0])
        authoring.share_inputs(node, inputs, owner, recipe.act)
        mark_annotated(node)

    def shared(self, node: Node) -> None:
        x = _quantized_input(node)
        if x is None:
            return
        shared = qw.SharedQuantizationSpec(x)
        authoring.annotate_input_qspec_map(node, x, shared)
        authoring.annotate_output_qspec(node, shared)
        mark_annotated(node)

    def averaging(self, node: Node, recipe: Recipe) -> None:
        x = _quantized_input(node)
        if x is None:
            return
        authoring.annotate_input_qspec_map(node, x, qw.SharedQuantizationSpec(x))
        authoring.annotate_output_qspec(node, recipe.act)
        mark_annotated(node)

    def unary_own(self, node: Node, recipe: Recipe) -> None:
        x = node.args[0] if node.args else None
        if not _is_float32(x):
            return
        assert isinstance(x, Node)
        authoring.annotate_input_qspec_map(node, x, _input_spec(x, recipe))
        authoring.annotate_output_qspec(node, recipe.act)
        mark_annotated(node)

    def split(self, node: Node) -> None:
        """The input shares its producer's range; the outputs (getitem nodes) stay float here
        and every quantized consumer quantizes them with that same range (:func:`_input_spec`),
        so ORT sees DQ -> Split -> Q with one range on every side."""
        x = _quantized_input(node)
        if x is None:
            return
        authoring.annotate_input_qspec_map(node, x, qw.SharedQuantizationSpec(x))
        mark_annotated(node)

    # -- dynamic ---------------------------------------------------------------------------------

    def dynamic(self, node: Node, recipe: Recipe) -> None:
        """linear: dynamic input, int8 weight; matmul: both inputs dynamic; outputs float."""
        if node.target == aten.linear.default:
            x, weight = node.args[0], node.args[1] if len(node.args) > 1 else None
            if not _is_float32(x) or not isinstance(weight, Node):
                return
            assert isinstance(x, Node)
            authoring.annotate_input_qspec_map(node, x, recipe.act)
            authoring.annotate_input_qspec_map(node, weight, recipe.weights[0])
            mark_annotated(node)
        elif node.target in _MATMUL:
            if len(node.args) < 2 or not all(_is_float32(a) for a in node.args[:2]):
                return
            if not self.matmul_wanted(node, recipe):
                return
            for arg in node.args[:2]:
                assert isinstance(arg, Node)
                authoring.annotate_input_qspec_map(node, arg, recipe.act)
            mark_annotated(node)


def _int32_bias_fits(node: Node, x: Node) -> bool:
    """Where ORT's quantize_static writes an int32 bias: ONNX Conv / ConvTranspose (groups 1:
    its weight channels are its output channels) and Gemm (a linear on 2-D input; on more
    dimensions the exporter writes MatMul + Add, whose bias ORT leaves float)."""
    if node.target == aten.linear.default:
        value = x.meta.get("val")
        return isinstance(value, torch.Tensor) and value.dim() == 2
    if node.target in _TRANSPOSED:
        groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
        return bool(groups == 1)
    return True


def _input_spec(arg: Node, recipe: Recipe) -> Any:
    """The spec of an activation input: a split output (getitem of a split this recipe
    quantized) shares the split input's range; anything else gets its own."""
    source = _split_source(arg)
    return recipe.act if source is None else qw.SharedQuantizationSpec(source)


def _quantized_input(node: Node) -> Node | None:
    """The node whose quantized output ``node`` reads (a split output: the split's input)."""
    x = node.args[0] if node.args else None
    if isinstance(x, Node) and _is_float32(x) and _has_output_qparams(x):
        return x
    return _split_source(x) if isinstance(x, Node) else None

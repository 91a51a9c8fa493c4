"""How each XNNPACK pattern is found and annotated: one ``find_*`` per matcher of the rule table
(:mod:`._rules`), yielding :class:`Match` es in graph order. A match's ``annotate(config)``
writes the annotation, or returns why the pattern stays float (the report shows it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave import authoring
from quantweave.authoring import calls, is_float_tensor, only_user

from ._blockwise import groupwise_reason
from ._config import transpose_weight_spec
from ._graph import (
    BATCH_NORM,
    CAT,
    CONV,
    CONV_T,
    LINEAR,
    POOL,
    RELU,
    conv_transpose_groups,
    has_output_qparams,
    is_huge_scalar,
    traces_to_output_qparams,
    weight_shape,
)

Annotate = Callable[[qw.QuantizationConfig], "str | None"]

#: why a pattern stays float (the report prefixes the matcher's name)
GROUPED_CONV_TRANSPOSE = "conv_transpose with groups != 1 is not quantized for XNNPACK"
DYNAMIC_CONV_NOT_4D = "dynamic quantization of conv needs a 4-D (conv2d) weight"
DYNAMIC_DEPTHWISE = "dynamic quantization of a depthwise conv is not supported by XNNPACK"
HUGE_SCALAR = "operand {!r} is a scalar beyond torch.histc's range (> 3.4e15)"
NOT_FLOAT32 = "operand {!r} is not a float32 tensor"
CAT_NOT_FLOAT32 = "cat of tensors that are not all float32"


@dataclass
class Match:
    """One occurrence of a pattern: its compute nodes, and how to annotate it."""

    nodes: list[Node]  # the call_function nodes the pattern claims (filters look at these)
    anchor: Node
    annotate: Annotate  # returns a reason to leave it float, or None


def _weighted(node: Node, config: qw.QuantizationConfig, transpose: bool) -> None:
    x, weight = node.args[0], node.args[1]
    if isinstance(x, Node):
        authoring.annotate_input_qspec_map(node, x, config.input_activation)
    if isinstance(weight, Node):
        spec = config.weight
        if transpose and spec is not None:
            spec = transpose_weight_spec(spec)
        authoring.annotate_input_qspec_map(node, weight, spec)
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    if isinstance(bias, Node):
        authoring.annotate_input_qspec_map(node, bias, config.bias)


def _weighted_then(node: Node, last: Node, transpose: bool) -> Annotate:
    """Annotate a weighted op; ``last`` (the op itself, or its relu / batch norm) gets the output qparams."""

    def annotate(config: qw.QuantizationConfig) -> str | None:
        if transpose and conv_transpose_groups(node) != 1:
            return GROUPED_CONV_TRANSPOSE
        if (reason := groupwise_reason(node, config)) is not None:
            return reason
        _weighted(node, config, transpose)
        authoring.annotate_output_qspec(last, config.output_activation)
        return None

    return annotate


def find_conv_bn(gm: GraphModule, with_relu: bool, transpose: bool = False) -> Iterator[Match]:
    for conv in list(gm.graph.nodes):
        if not calls(conv, CONV_T if transpose else CONV):
            continue
        if transpose and conv_transpose_groups(conv) != 1:
            continue  # left to conv_transpose, which records why
        bn = only_user(conv)
        if bn is None or not calls(bn, BATCH_NORM) or bn.args[:1] != (conv,):
            continue
        relu = only_user(bn) if with_relu else None
        if with_relu and (relu is None or not calls(relu, RELU)):
            continue
        last = relu if relu is not None else bn
        nodes = [conv, bn] + ([relu] if relu is not None else [])
        yield Match(nodes, conv, _weighted_then(conv, last, transpose))


def _op_then_relu(gm: GraphModule, ops: frozenset[Any]) -> Iterator[tuple[Node, Node]]:
    """(op, relu) where the op's only user is the relu."""
    for relu in list(gm.graph.nodes):
        if not calls(relu, RELU):
            continue
        node = relu.args[0]
        if isinstance(node, Node) and calls(node, ops) and len(node.users) == 1:
            yield node, relu


def find_linear_relu(gm: GraphModule) -> Iterator[Match]:
    for linear, relu in _op_then_relu(gm, LINEAR):
        yield Match([linear, relu], linear, _weighted_then(linear, relu, False))


def find_linear(gm: GraphModule) -> Iterator[Match]:
    for linear in list(gm.graph.nodes):
        if calls(linear, LINEAR):
            yield Match([linear], linear, _weighted_then(linear, linear, False))


def find_conv(gm: GraphModule, transpose: bool) -> Iterator[Match]:
    for conv in list(gm.graph.nodes):
        if not calls(conv, CONV_T if transpose else CONV):
            continue
        user = only_user(conv)
        if user is not None and calls(user, RELU):
            continue  # left to conv + relu

        def annotate(config: qw.QuantizationConfig, conv: Node = conv) -> str | None:
            if transpose and conv_transpose_groups(conv) != 1:
                return GROUPED_CONV_TRANSPOSE
            act = config.input_activation
            if act is not None and act.is_dynamic:
                shape = weight_shape(conv.args[1])
                if shape is not None and len(shape) != 4:
                    return DYNAMIC_CONV_NOT_4D
                if not transpose and shape is not None and shape[1] == 1:
                    return DYNAMIC_DEPTHWISE
            return _weighted_then(conv, conv, transpose)(config)

        yield Match([conv], conv, annotate)


def find_conv_relu(gm: GraphModule, transpose: bool) -> Iterator[Match]:
    for conv, relu in _op_then_relu(gm, CONV_T if transpose else CONV):
        yield Match([conv, relu], conv, _weighted_then(conv, relu, transpose))


def find_adaptive_avg_pool2d(gm: GraphModule) -> Iterator[Match]:
    for pool in list(gm.graph.nodes):
        if not calls(pool, POOL) or not isinstance(pool.args[0], Node):
            continue

        def annotate(config: qw.QuantizationConfig, pool: Node = pool) -> str | None:
            x = pool.args[0]
            assert isinstance(x, Node)
            spec: Any = config.input_activation
            if has_output_qparams(x):
                spec = qw.SharedQuantizationSpec(x)
            authoring.annotate_input_qspec_map(pool, x, spec)
            authoring.annotate_output_qspec(pool, qw.SharedQuantizationSpec((x, pool)))
            return None

        yield Match([pool], pool, annotate)


def _binary(node: Node, last: Node) -> Annotate:
    def annotate(config: qw.QuantizationConfig) -> str | None:
        for operand in node.args[:2]:
            if not isinstance(operand, Node):
                continue
            if is_huge_scalar(operand):
                return HUGE_SCALAR.format(operand.name)
            if not is_float_tensor(operand):
                return NOT_FLOAT32.format(operand.name)
        for operand in node.args[:2]:
            if isinstance(operand, Node):
                authoring.annotate_input_qspec_map(node, operand, config.input_activation)
        authoring.annotate_output_qspec(last, config.output_activation)
        return None

    return annotate


def find_binary_relu(gm: GraphModule, ops: frozenset[Any]) -> Iterator[Match]:
    for node, relu in _op_then_relu(gm, ops):
        yield Match([node, relu], node, _binary(node, relu))


def find_binary(gm: GraphModule, ops: frozenset[Any]) -> Iterator[Match]:
    for node in list(gm.graph.nodes):
        if calls(node, ops):
            yield Match([node], node, _binary(node, node))


def find_cat(gm: GraphModule) -> Iterator[Match]:
    for cat in list(gm.graph.nodes):
        if not calls(cat, CAT) or not isinstance(cat.args[0], (list, tuple)) or not cat.args[0]:
            continue

        def annotate(config: qw.QuantizationConfig, cat: Node = cat) -> str | None:
            tensors: Any = cat.args[0]
            inputs = [i for i in tensors if isinstance(i, Node)]
            if len(inputs) != len(tensors) or not all(is_float_tensor(i) for i in inputs):
                return CAT_NOT_FLOAT32
            owner = next((i for i in inputs if traces_to_output_qparams(i)), inputs[0])
            authoring.share_inputs(cat, inputs, owner, config.input_activation)
            return None

        yield Match([cat], cat, annotate)

"""Why a node of one of x86's patterns stayed float: the reasons its rule rows give."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from quantweave.authoring import WEIGHT_MATMUL_OPS, describe_node, is_float_tensor, op_name, weight_matmul
from quantweave.plugin_api import ANNOTATED_BY_KEY, ANNOTATION_KEY, is_annotated

from . import _ops as ops
from ._annotate import X86Annotation, ends_quantized_pattern
from ._padding import padding_of, why_padding_conv_float

# activations (and batch norm) x86 quantizes only fused after a producer: op -> (producers, in words)
_FUSES_AFTER: dict[Any, tuple[tuple[Any, ...], str]] = {
    **dict.fromkeys(ops.RELU, ((ops.CONV1D, ops.CONV2D, ops.LINEAR, *ops.ADD), "conv1d, conv2d, linear, or their add")),
    **dict.fromkeys(tuple(t for t in ops.CONV_UNARY if t not in ops.RELU), ((ops.CONV2D,), "conv2d")),
    **dict.fromkeys(
        (torch.ops.aten.leaky_relu.default, torch.ops.aten.tanh.default, torch.ops.aten.gelu.default),
        ((ops.LINEAR,), "linear"),
    ),
    ops.BATCH_NORM: ((ops.CONV2D,), "conv2d (QAT; in post-training batch norm is folded into the conv)"),
}


def what_is(node: Node) -> str:
    """What ``node`` is, for a reason: float, or quantized by someone other than x86."""
    annotation = node.meta.get(ANNOTATION_KEY)
    if node.op == "placeholder":
        return f"{node.name} is a float model input"
    if node.op != "call_function":
        return f"{describe_node(node)} is float"
    if is_annotated(node) and not isinstance(annotation, X86Annotation):
        by = node.meta.get(ANNOTATED_BY_KEY)
        return f"{describe_node(node)} was annotated by another quantizer" + (f" ({by})" if isinstance(by, str) else "")
    if is_annotated(node) and ends_quantized_pattern(node):
        return f"{describe_node(node)} already ends an x86 pattern of its own"
    if is_annotated(node):
        return f"{describe_node(node)} is inside an x86 pattern but does not end it"
    return f"{describe_node(node)} is float"


def why_weighted(node: Node) -> str | None:
    if node.target not in ops.WEIGHTED_OPS:
        return None
    return f"{op_name(node)} was not matched by an x86 pattern (its input or weight is not a graph tensor)"


def why_weight_matmul(node: Node) -> str | None:
    """addmm / mm / matmul are quantized as linears only with a constant [in, out] weight."""
    if node.target not in WEIGHT_MATMUL_OPS or weight_matmul(node) is not None:
        return None
    if node.target == ops.MATMUL:
        return None  # a product of two activations: the matmul row says why
    return (
        f"{op_name(node)} is quantized by x86 as a linear only between a float32 activation and a constant "
        "2-D weight (a parameter or buffer, stored [in, out]) with a constant 1-D bias; here it is not"
    )


def why_add(node: Node) -> str | None:
    if node.target not in ops.ADD:
        return None
    rule = "add is quantized by x86 only fused after a conv2d or linear whose only user it is (conv2d_add, linear_add)"
    inputs = [a for a in node.args[:2] if isinstance(a, Node)]
    fusable = [a for a in inputs if a.target in (ops.CONV2D, ops.LINEAR, ops.BATCH_NORM)]
    if len(inputs) < 2:
        return f"{rule}; here one operand is not a tensor"
    if not fusable:
        return f"{rule}; neither input is a conv2d or linear"
    producer = fusable[0]
    if inputs[0] is inputs[1]:
        return f"{rule}; here both operands are {describe_node(producer)} (x + x), which cannot be fused"
    if len(producer.users) > 1:
        return f"{rule}; its input {describe_node(producer)} has other users, so they cannot be fused"
    return f"{rule}; its input {what_is(producer)}"


def why_fused(node: Node) -> str | None:
    """An activation (or batch norm) that did not follow a producer it fuses with."""
    if node.target not in _FUSES_AFTER:
        return None
    producers, patterns = _FUSES_AFTER[node.target]
    rule = f"{op_name(node)} is quantized by x86 only fused after {patterns}"
    first = node.args[0] if node.args else None
    if not isinstance(first, Node):
        return f"{rule}; its input is not a graph tensor"
    if first.target in ops.PADDING_CONVS and padding_of(first) is None:
        return f"{rule}; here it follows {describe_node(first)}, which stays float: {why_padding_conv_float(first)}"
    if first.target not in producers:
        return f"{rule}; here it follows {describe_node(first)}"
    if len(first.users) > 1:
        return f"{rule}; its input {describe_node(first)} has other users, so they cannot be fused"
    return f"{rule}; its input {what_is(first)}"


def why_two_inputs(node: Node) -> str | None:
    if node.target not in (ops.MUL, ops.MATMUL):
        return None
    op = op_name(node)
    if len(node.args) != 2 or not all(is_float_tensor(a) for a in node.args):
        dtypes = [getattr(getattr(a, "meta", {}).get("val"), "dtype", None) for a in node.args[:2]]
        other = next((d for d in dtypes if isinstance(d, torch.dtype) and d != torch.float32), None)
        if other is not None:
            return f"{op} is quantized by x86 only between float32 tensors; here an operand is {other}"
        return f"{op} is quantized by x86 only between two tensors; here an operand is a scalar or constant"
    a, b = node.args
    assert isinstance(a, Node) and isinstance(b, Node)
    if node.target == ops.MUL and a.meta["val"].shape != b.meta["val"].shape:
        return f"mul is quantized by x86 only for inputs of the same shape; here {tuple(a.meta['val'].shape)} " + (
            f"x {tuple(b.meta['val'].shape)} (broadcast)"
        )
    return f"{op} was not matched by an x86 pattern here"


def why_propagated(node: Node) -> str | None:
    """Pooling, cat and flatten: quantized only after one of x86's own patterns."""
    if node.target not in ops.PROPAGATE:
        return None
    if node.target == ops.CAT:
        for i in node.all_input_nodes:
            if not ends_quantized_pattern(i):
                return (
                    "cat is quantized by x86 only when every input is the output of a quantized x86 pattern; "
                    f"here {what_is(i)}"
                )
    if node.target == ops.FLATTEN and node.users and not any(u.target in ops.QUANTIZABLE for u in node.users):
        return "not followed by a quantized consumer (x86 quantizes flatten only when a conv / linear / mul uses it)"
    if node.all_input_nodes:
        first = node.all_input_nodes[0]
        if not ends_quantized_pattern(first):
            return (
                f"input is not quantized by an x86 pattern ({op_name(node)} is quantized only when its input is): "
                f"{what_is(first)}"
            )
    return None

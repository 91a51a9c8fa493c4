"""Lowering: a quantized linear written as a matrix product, as the linear inductor fuses.

x86 quantizes ``addmm(bias, x, W)``, ``mm(x, W)`` and ``matmul(x, W)`` with a constant weight
stored ``[in, out]`` (GPT-2's ``Conv1D``, ``x @ W``) as a linear: the converted model reads the
int8 weight through ``dequantize_per_channel(..., axis=1)``. Inductor's int8 linear pass
matches the weight of a linear (``[out, in]``, axis 0), so before compiling, each such product
is written as ``aten.linear`` of the transposed int8 weight (the same values, exactly) on a new
GraphModule; the converted model is not changed.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from quantweave.authoring import WEIGHT_AXIS, attr_value, copy_for_rewrite, finish_rewrite

__all__ = ["matmuls_as_linears"]

aten = torch.ops.aten
_DEQUANTIZE_PER_CHANNEL = torch.ops.quantized_decomposed.dequantize_per_channel.default
_PRODUCTS = (aten.addmm.default, aten.mm.default, aten.matmul.default)


def _int8_weight(node: Node) -> Node | None:
    """The ``dequantize_per_channel(int8 [in, out] constant, ..., axis=1)`` a product reads as
    its weight, or None."""
    weight = node.args[2] if node.target == aten.addmm.default else node.args[1]
    if not (isinstance(weight, Node) and weight.op == "call_function" and weight.target == _DEQUANTIZE_PER_CHANNEL):
        return None
    if len(weight.args) < 4 or weight.args[3] != WEIGHT_AXIS or len(weight.users) != 1:
        return None
    value = attr_value(weight.args[0])
    return weight if isinstance(value, torch.Tensor) and value.dim() == 2 else None


def _rewritable(node: Node) -> bool:
    if node.op != "call_function" or node.target not in _PRODUCTS or node.kwargs:
        return False
    if len(node.args) != (3 if node.target == aten.addmm.default else 2):
        return False
    return _int8_weight(node) is not None


def matmuls_as_linears(converted: GraphModule) -> GraphModule:
    """``converted`` with each product of an int8 ``[in, out]`` weight written as
    ``aten.linear`` (a new GraphModule sharing the other tensors), or ``converted`` itself
    when it has none."""
    if not any(_rewritable(n) for n in converted.graph.nodes):
        return converted
    rewritten, nodes = copy_for_rewrite(converted)
    for node in list(nodes.values()):
        if not _rewritable(node):
            continue
        dequantize = _int8_weight(node)
        assert dequantize is not None
        source = dequantize.args[0]
        assert isinstance(source, Node)
        name = f"{str(source.target).replace('.', '_')}_t"
        while hasattr(rewritten, name):
            name += "_"
        rewritten.register_buffer(name, attr_value(source).t().contiguous())
        with rewritten.graph.inserting_before(dequantize):
            transposed = rewritten.graph.get_attr(name)
        dequantize.args = (transposed, *dequantize.args[1:3], 0, *dequantize.args[4:])
        for key in ("val", "tensor_meta"):  # recorded for the [in, out] weight
            dequantize.meta.pop(key, None)
        if node.target == aten.addmm.default:
            bias, x, weight = node.args
            node.args = (x, weight, bias)
        node.target = aten.linear.default
    return finish_rewrite(rewritten)

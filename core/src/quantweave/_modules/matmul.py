"""Matrix products with a constant weight: linears written as ``addmm`` / ``mm`` / ``matmul``
(re-exported by :mod:`quantweave.authoring`; read by the conformance kit and the report).

GPT-2's ``Conv1D`` (``transformers.pytorch_utils``) stores its weight ``[in, out]`` and exports
as ``aten.addmm(bias, x, weight)``; a hand-written ``x @ W + b`` exports as
``aten.matmul(x, W)``. Both are linears whose weight is the transpose of ``nn.Linear``'s:
quantized per channel, the output channels are axis 1 (:data:`WEIGHT_AXIS`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import torch
from torch.fx import GraphModule, Node

from ..annotation import QuantizationSpec
from .graph import copy_graph_module, get_attr_value, rebuild
from .torch_compat import FakeQuantize, FusedMovingAvgObsFakeQuantize, quantized_decomposed_ops

__all__ = [
    "WEIGHT_AXIS",
    "WEIGHT_MATMUL_OPS",
    "WeightMatmul",
    "channel_axis_spec",
    "products_as_linears",
    "weight_matmul",
]

aten = torch.ops.aten

#: the ops :func:`weight_matmul` recognises (the anchors of the core patterns ``addmm``,
#: ``mm`` and ``matmul_weight``)
WEIGHT_MATMUL_OPS = (aten.addmm.default, aten.mm.default, aten.matmul.default)

#: the output-channel axis of an [in, out] weight (per-channel quantization)
WEIGHT_AXIS = 1


class WeightMatmul(NamedTuple):
    """A linear written as a matrix product: its activation, its constant ``[in, out]``
    weight and its bias (None for ``mm`` / ``matmul``)."""

    x: Node
    weight: Node
    bias: Node | None


def _attr_value(node: Any) -> Any:
    """What a ``get_attr`` node reads (None for any other node, or a missing target)."""
    if not isinstance(node, Node) or node.op != "get_attr" or node.graph.owning_module is None:
        return None
    try:
        return get_attr_value(node.graph.owning_module, str(node.target))
    except AttributeError:
        return None


def _is_float32(node: Any) -> bool:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


def _constant_matrix(node: Any) -> bool:
    value = _attr_value(node)
    return isinstance(value, torch.Tensor) and value.dim() == 2 and value.dtype == torch.float32


def weight_matmul(node: Any) -> WeightMatmul | None:
    """``node`` as a linear, when it is ``addmm(bias, x, W)``, ``mm(x, W)`` or ``matmul(x, W)``
    of a float32 activation ``x`` and a constant (parameter or buffer: a ``get_attr``) 2-D
    float32 weight ``W`` stored ``[in, out]``, with ``addmm``'s bias a constant 1-D tensor and
    plain ``beta`` / ``alpha``; None otherwise (a product of two activations, ``W @ x``)."""
    if not isinstance(node, Node) or node.op != "call_function" or node.target not in WEIGHT_MATMUL_OPS:
        return None
    if node.target == aten.addmm.default:
        if len(node.args) != 3 or node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        bias, x, weight = node.args
        bias_value = _attr_value(bias)
        if not (isinstance(bias_value, torch.Tensor) and bias_value.dim() == 1):
            return None
    else:
        if len(node.args) != 2 or node.kwargs:
            return None
        (x, weight), bias = node.args, None
    if not (isinstance(x, Node) and _is_float32(x) and isinstance(weight, Node) and _constant_matrix(weight)):
        return None
    return WeightMatmul(x, weight, bias if isinstance(bias, Node) else None)


def channel_axis_spec(spec: Any, axis: int = WEIGHT_AXIS) -> Any:
    """``spec`` (a weight :class:`~quantweave.QuantizationSpec`) with its channels on ``axis``
    (default the output channels of an ``[in, out]`` weight); anything else (None, a shared
    or derived spec) unchanged. torch's fused fake-quantizer supports per-channel only on axis
    0, so a per-channel QAT spec built on it gets the unfused ``FakeQuantize`` with the same
    arguments."""
    if not isinstance(spec, QuantizationSpec) or spec.ch_axis == axis:
        return spec
    spec = replace(spec, ch_axis=axis)
    per_channel = spec.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine)
    partial = getattr(spec.observer_or_fake_quant_ctr, "p", None)
    if per_channel and axis != 0 and getattr(partial, "func", None) is FusedMovingAvgObsFakeQuantize:
        keywords = dict(getattr(partial, "keywords", {}))
        spec = replace(spec, observer_or_fake_quant_ctr=FakeQuantize.with_args(**keywords))
    return spec


def _dequantize(kind: str) -> Any:
    return getattr(quantized_decomposed_ops(), f"dequantize_per_{kind}").default


_PRODUCTS = (aten.addmm.default, aten.mm.default, aten.matmul.default)


def _int8_weight(node: Node) -> Node | None:
    """The ``dequantize_per_channel(int8 [in, out] constant, ..., axis=1)`` (or
    ``dequantize_per_tensor``) a product reads as its weight, or None."""
    weight = node.args[2] if node.target == aten.addmm.default else node.args[1]
    if not (isinstance(weight, Node) and weight.op == "call_function" and len(weight.users) == 1):
        return None
    if weight.target == _dequantize("channel"):
        if len(weight.args) < 4 or weight.args[3] != WEIGHT_AXIS:
            return None
    elif weight.target != _dequantize("tensor"):
        return None
    value = _attr_value(weight.args[0])
    return weight if isinstance(value, torch.Tensor) and value.dim() == 2 else None


def _rewritable(node: Node) -> bool:
    if node.op != "call_function" or node.target not in _PRODUCTS or node.kwargs:
        return False
    if len(node.args) != (3 if node.target == aten.addmm.default else 2):
        return False
    return _int8_weight(node) is not None


def products_as_linears(converted: GraphModule) -> GraphModule:
    """For lowering: ``converted`` (a converted model) with each product of a quantized
    ``[in, out]`` weight (``addmm`` / ``mm`` / ``matmul`` reading
    ``dequantize_per_channel(int8 weight, ..., axis=1)`` or ``dequantize_per_tensor``)
    written as ``aten.linear`` of the transposed int8 weight (per channel on axis 0): the
    same values, exactly, in the form backends' int8 linear passes match (inductor's,
    XNNPACK's). A new GraphModule sharing the other tensors, or ``converted`` itself when it
    has none; ``converted`` is not changed."""
    if not any(_rewritable(n) for n in converted.graph.nodes):
        return converted
    rewritten, node_map = copy_graph_module(converted)
    nodes = {n.name: n for n in node_map.values()}
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
        rewritten.register_buffer(name, _attr_value(source).t().contiguous())
        with rewritten.graph.inserting_before(dequantize):
            transposed = rewritten.graph.get_attr(name)
        if dequantize.target == _dequantize("channel"):
            dequantize.args = (transposed, *dequantize.args[1:3], 0, *dequantize.args[4:])
        else:
            dequantize.args = (transposed, *dequantize.args[1:])
        for key in ("val", "tensor_meta"):  # recorded for the [in, out] weight
            dequantize.meta.pop(key, None)
        if node.target == aten.addmm.default:
            bias, x, weight = node.args
            node.args = (x, weight, bias)
        node.target = aten.linear.default
    return rebuild(rewritten)

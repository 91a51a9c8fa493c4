"""Convert-time rules that make ``convert_pt2e`` behave as PT2E users expect (torchao 0.18's
behaviour where it is right), kept out of ``convert.py`` so that module stays the flow:

- :func:`replace_placeholder` -- an observer of a float *placeholder* spec (float32 /
  bfloat16: the tensor is left as it is; float16: rounded through float16 and back with
  ``quantized_decomposed.convert_element_type.no_fuse``, as torchao emits it);
- :func:`mutable_attr_nodes` -- ``get_attr`` nodes of tensors the graph writes in place (a
  KV cache updated with ``index_put_`` / ``copy_``): never constants, so never folded into a
  frozen quantized constant;
- :func:`is_dynamic_dequantize` -- a dequantize fed by run-time per-tensor qparams
  (``choose_qparams -> getitem -> quantize -> dequantize``): one per dynamically quantized
  tensor, shared by its users (not duplicated per user as static and per-token ones are);
- :func:`convert_hook` -- an observer that converts itself (``convert(model, observer_node)``,
  as torchao's affine observers and fake-quantizers define): convert calls it, and
  :func:`fold_constant_quantizes` stores the constant (weight) quantizes it made as frozen buffers;
- :func:`port_quantization_tags` -- ``quantization_tag`` (read by lowering passes) on the
  quantize / dequantize / choose_qparams nodes convert creates, by the PT2E porting rules.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from ..annotation import ANNOTATION_KEY
from .graph import mutated_attrs, new_attr_name
from .qtypes import is_float8_dtype, is_integer_dtype
from .torch_compat import quantized_decomposed_ops

__all__ = [
    "TAG_KEY",
    "convert_hook",
    "fold_constant_quantizes",
    "is_dynamic_dequantize",
    "is_placeholder",
    "mutable_attr_nodes",
    "port_quantization_tags",
    "replace_placeholder",
]

#: the ``node.meta`` key lowering passes read to group nodes (PT2E's name)
TAG_KEY = "quantization_tag"


def is_placeholder(dtype: Any) -> bool:
    """True when an observer of ``dtype`` quantizes nothing (a float dtype that is not float8)."""
    return not is_integer_dtype(dtype) and not is_float8_dtype(dtype)


def replace_placeholder(graph: Graph, node: Node, source: Node, dtype: Any) -> None:
    """Replace the observer ``node`` of a placeholder spec: float16 rounds through float16
    and back to float32 (torchao's ``convert_element_type.no_fuse`` pair); any other float
    dtype leaves the tensor as it is."""
    if dtype == torch.float16:
        op = quantized_decomposed_ops().convert_element_type.no_fuse
        with graph.inserting_before(node):
            to_half = graph.call_function(op, (source, torch.float16))
            back = graph.call_function(op, (to_half, torch.float32))
        for key in ("stack_trace", "nn_module_stack"):
            if key in source.meta:
                to_half.meta[key] = back.meta[key] = source.meta[key]
        val = source.meta.get("val")
        if isinstance(val, torch.Tensor):
            back.meta["val"] = val.to(torch.float32)
        node.replace_all_uses_with(back)
    else:
        node.replace_all_uses_with(source)
    graph.erase_node(node)


def mutable_attr_nodes(graph: Graph) -> dict[Node, bool]:
    """``{get_attr node: False}`` for every read of a tensor the graph writes in place: a seed
    for convert's constant cache, so such a tensor (and anything computed from it) is never
    folded into a frozen constant -- its value at conversion time is not its value at run time."""
    targets = mutated_attrs(graph)
    return {n: False for n in graph.nodes if n.op == "get_attr" and str(n.target) in targets}


def _choose_ops() -> tuple[Any, ...]:
    qd = quantized_decomposed_ops()
    return (qd.choose_qparams.tensor, qd.choose_qparams_symmetric.tensor)


def is_dynamic_dequantize(node: Node) -> bool:
    """True for a dequantize whose quantize takes its per-tensor scale from a choose_qparams op
    (a per-token dequantize is not: XNNPACK's partitioner wants one per dynamically quantized linear)."""
    quant = node.args[0] if node.args else None
    if not isinstance(quant, Node) or len(quant.args) < 2:
        return False
    scale = quant.args[1]
    return (
        isinstance(scale, Node)
        and scale.op == "call_function"
        and scale.target is operator.getitem
        and isinstance(scale.args[0], Node)
        and scale.args[0].target in _choose_ops()
    )


def convert_hook(module: object) -> Callable[[GraphModule, Node], Any] | None:
    """The observer's own ``convert(model, observer_node)`` method, or None.

    torchao's affine observers (``AffineQuantizedMinMaxObserver``...) and fake-quantizers
    convert themselves this way; torch's observers have no such method. A module counts
    when it is an ``nn.Module`` with callable ``convert`` and ``calculate_qparams``."""
    if not isinstance(module, torch.nn.Module):
        return None
    hook = getattr(module, "convert", None)
    if callable(hook) and callable(getattr(module, "calculate_qparams", None)):
        return hook
    return None


def fold_constant_quantizes(
    gm: GraphModule, nodes: Iterable[Node], constant: Callable[[Node], bool], evaluate: Callable[[Node], Any]
) -> list[Node]:
    """Store each quantize op among ``nodes`` (made by observers' own ``convert`` hooks) whose
    inputs are all constant as a frozen buffer read by a get_attr (as convert does for its own
    quantize ops, and torchao's constant folding for the affine ones). Returns the folded
    quantize nodes' inputs (to erase when left without users)."""
    inputs: list[Node] = []
    for node in list(nodes):
        name = str(getattr(node.target, "__name__", node.target))
        if node.op != "call_function" or "quantize" not in name or "dequantize" in name or not constant(node):
            continue
        with torch.no_grad():
            value = evaluate(node)
        if not isinstance(value, torch.Tensor):
            continue
        attr = new_attr_name(gm, "_frozen_param")
        gm.register_buffer(attr, value)
        with gm.graph.inserting_before(node):
            frozen = gm.graph.get_attr(attr)
        frozen.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")})
        node.replace_all_uses_with(frozen)
        inputs.extend(node.all_input_nodes)
        gm.graph.erase_node(node)
    return inputs


def _annotated(node: Node, attr: str) -> bool:
    """True when ``node``'s annotation has an output spec (``attr="output_qspec"``) or any
    input spec (``attr="input_qspec_map"``)."""
    value = getattr(node.meta.get(ANNOTATION_KEY), attr, None)
    if isinstance(value, dict):
        return any(spec is not None for spec in value.values())
    return value is not None


def port_quantization_tags(graph: Graph, created: Iterable[Node], dequantize_ops: Iterable[Any]) -> None:
    """Give the nodes convert ``created`` the ``quantization_tag`` PT2E gives them:

    - a dequantize takes the tag of its consumer when the consumer is annotated with input
      specs; for a dynamically quantized input its quantize and choose_qparams nodes take it too;
    - a static quantize takes the tag of the annotated producer it quantizes the output of,
      or of the weight's ``get_attr`` it quantizes; a folded weight keeps its weight's tag;
    - otherwise a created node carries no tag (it belongs to no tagged pattern).
    """
    dequantize = set(dequantize_ops)
    # a folded weight (get_attr) keeps the tag convert copied from the weight it was made from
    created = [n for n in created if n.graph is graph and n.op == "call_function"]
    for node in created:
        node.meta.pop(TAG_KEY, None)
    for node in created:
        if node.op != "call_function":
            continue
        if node.target in dequantize:
            tagged = [u for u in node.users if TAG_KEY in u.meta and _annotated(u, "input_qspec_map")]
            if not tagged:
                continue
            tag = tagged[0].meta[TAG_KEY]
            node.meta[TAG_KEY] = tag
            if is_dynamic_dequantize(node):
                quant = node.args[0]
                assert isinstance(quant, Node)
                choose = quant.args[1].args[0]  # type: ignore[union-attr]
                assert isinstance(choose, Node)
                for part in (quant, choose, *choose.users):
                    part.meta[TAG_KEY] = tag
        elif any(u.target in dequantize for u in node.users) and not any(is_dynamic_dequantize(u) for u in node.users):
            source = node.args[0] if node.args else None
            if not isinstance(source, Node) or TAG_KEY not in source.meta:
                continue
            if source.op == "get_attr" or _annotated(source, "output_qspec"):
                node.meta[TAG_KEY] = source.meta[TAG_KEY]

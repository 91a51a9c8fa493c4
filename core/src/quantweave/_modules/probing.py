"""Running a quantizer on a probe and reading what it annotated: shared by the conformance kit
(``quantweave.testing.conformance``) and the derivation of capabilities by probing
(:mod:`quantweave._modules.derive`)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from torch.fx import GraphModule, Node

from ..annotation import ANNOTATION_KEY, FixedQParamsQuantizationSpec, QuantizationAnnotation
from .foreign import translate_annotations
from .functionalize import functionalize_in_place
from .graph import copy_graph_module
from .matmul import weight_matmul
from .patterns import node_op
from .records import FLOAT, Quant, tensor_quant_from_spec

__all__ = ["activation_inputs", "annotate_copy", "bias_input", "has_specs", "output_found", "weight_input"]


def annotate_copy(quantizer: Any, exported: GraphModule, label: str, quiet: bool = False) -> GraphModule:
    """A copy of ``exported`` run through ``quantizer.transform_for_annotation`` and
    ``annotate``, torchao-class annotations translated to quantweave's (claims by ``label``);
    ``quiet`` silences the quantizer's warnings. As in ``prepare_pt2e``, an in-place op whose
    write nobody else sees is annotated as its functional op."""
    gm, _ = copy_graph_module(exported)
    functionalize_in_place(gm)
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        gm = quantizer.transform_for_annotation(gm)
        quantizer.annotate(gm)
    translate_annotations(gm.graph, lambda node: label)
    return gm


def has_specs(node: Node) -> bool:
    """True when ``node`` carries a quantization annotation with some spec."""
    annotation = node.meta.get(ANNOTATION_KEY)
    return isinstance(annotation, QuantizationAnnotation) and (
        annotation.output_qspec is not None or any(s is not None for s in annotation.input_qspec_map.values())
    )


def activation_inputs(node: Node) -> list[Node]:
    """The activation inputs of a vocabulary op (none for embedding; every tensor of a cat;
    the activation of a product with a constant weight, :func:`~quantweave._modules.matmul.weight_matmul`)."""
    as_linear = weight_matmul(node)
    if as_linear is not None:
        return [as_linear.x]
    target = node_op(node)
    if target == "aten.embedding.default":
        return []
    if target == "aten.cat.default":
        return [a for a in node.args[0] if isinstance(a, Node)]  # type: ignore[union-attr]
    if target in ("aten.add.Tensor", "aten.mul.Tensor", "aten.matmul.default"):
        return [a for a in node.args[:2] if isinstance(a, Node)]
    return [node.args[0]] if isinstance(node.args[0], Node) else []


def weight_input(node: Node) -> Node | None:
    """The weight input of a conv, linear or embedding, or of a product with a constant
    weight (addmm / mm / matmul); None for other ops."""
    as_linear = weight_matmul(node)
    if as_linear is not None:
        return as_linear.weight
    target = node_op(node)
    index = 0 if target == "aten.embedding.default" else 1
    if target.startswith(("aten.conv", "aten.linear", "aten.embedding")) and len(node.args) > index:
        arg = node.args[index]
        return arg if isinstance(arg, Node) else None
    return None


def bias_input(node: Node) -> Node | None:
    """The bias of a weighted op: its third argument (a conv's, a linear's), ``addmm``'s
    first; None when it has none."""
    as_linear = weight_matmul(node)
    if as_linear is not None:
        return as_linear.bias
    bias = node.args[2] if len(node.args) > 2 else None
    return bias if isinstance(bias, Node) else None


def output_found(
    last: Node, anchor: Node, inputs: list[Node], specs: Mapping[Any, Any], roots: Mapping[Any, Any], resolved: Any
) -> Quant:
    """What the annotations do to the output of ``last``, as a :class:`Quant`."""
    spec = resolved(last)
    tensor = tensor_quant_from_spec(spec)
    if spec is None or tensor is None:
        return FLOAT
    for i, producer in enumerate(inputs):
        if (producer, anchor) in specs and roots[(producer, anchor)] == roots[last]:
            return Quant.shared(i)
    if isinstance(spec, FixedQParamsQuantizationSpec):
        return Quant.fixed(spec.scale, spec.zero_point, tensor)
    return Quant.quantized(tensor)

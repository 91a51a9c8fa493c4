"""The annotation steps of x86's recipe, one per family of rows in :mod:`._capabilities`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.authoring import (
    ConfigStage,
    calls,
    channel_axis_spec,
    first_user,
    is_float_tensor,
    mark_float,
    weight_matmul,
)
from quantweave.plugin_api import ANNOTATION_KEY, is_annotated, mark_annotated

from ._ops import (
    ADD,
    BATCH_NORM,
    CAT,
    CONV1D,
    CONV2D,
    CONV_UNARY,
    FLATTEN,
    LINEAR,
    LINEAR_UNARY,
    MATMUL,
    MUL,
    PROPAGATE,
    QUANTIZABLE,
    RELU,
)

KEY = ANNOTATION_KEY


@dataclass
class X86Annotation(qw.QuantizationAnnotation):
    """An annotation that also remembers whether the node ends a quantized pattern."""

    is_output_of_quantized_pattern: bool = False


def ends_quantized_pattern(node: Node) -> bool:
    return is_annotated(node) and bool(getattr(node.meta.get(KEY), "is_output_of_quantized_pattern", False))


class StageAnnotator:
    """Annotates one configuration stage over the whole graph: the table's steps, in order."""

    def __init__(self, stage: ConfigStage, accepts: Callable[[list[Node]], bool]) -> None:
        self.stage = stage
        self.accepts = accepts
        config = stage.config
        self.act = None if config is None else config.input_activation
        self.weight = None if config is None else config.weight
        self.bias = None if config is None else config.bias

    def claim(self, nodes: list[Node]) -> bool:
        """True when these nodes are free and this stage applies to them; a None config
        marks them float (later stages then skip them) and returns False."""
        if is_annotated(nodes) or not self.accepts(nodes):
            return False
        if self.stage.config is None:
            mark_float(nodes, f"{self.stage.description} configured None", annotation=X86Annotation)
            return False
        return True

    def run(self, gm: GraphModule, steps: Sequence[Callable[[StageAnnotator, list[Node]], None]]) -> None:
        nodes = list(gm.graph.nodes)
        for step in steps:
            step(self, nodes)

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


def binary_partner(producer: Node) -> tuple[Node, Node] | None:
    """(add, other input) when ``producer``'s only user is an add of two tensors."""
    if len(producer.users) != 1:
        return None
    (add,) = producer.users
    if add.op != "call_function" or add.target not in ADD or len(add.args) < 2:
        return None
    if add.args[0] is producer:
        other = add.args[1]
    elif add.args[1] is producer:
        other = add.args[0]
    else:
        return None
    # x + x: the fused op cannot take its own output as the other operand
    return (add, other) if isinstance(other, Node) and other is not producer else None


def _binary(
    a: StageAnnotator, nodes: list[Node], targets: Iterable[Any], with_relu: bool, quantize_other: bool
) -> None:
    """conv/linear whose only user is an add (+ relu). The recipe quantizes the add's other
    input for conv (``quantize_other``) and leaves it float for linear."""
    targets = tuple(targets)
    for producer in nodes:
        if producer.target not in targets:
            continue
        match = binary_partner(producer)
        if match is None:
            continue
        add, other = match
        relu = first_user(add, RELU) if with_relu else None
        if with_relu and relu is None:
            continue
        if not a.claim([producer, add] + ([relu] if relu is not None else [])):
            continue
        a.weighted(producer, ends_pattern=False)
        a.mark(add, {other: a.act} if quantize_other else {}, ends_pattern=relu is None)
        if relu is not None:
            a.mark(relu)


def _unary(a: StageAnnotator, nodes: list[Node], unaries: dict[Any, tuple[Any, ...]]) -> None:
    """conv/linear followed by an activation it can fuse (``unaries``: op -> activations)."""
    for producer in nodes:
        if producer.target not in unaries:
            continue
        activation = first_user(producer, unaries[producer.target])
        if activation is None or not a.claim([producer, activation]):
            continue
        a.weighted(producer, ends_pattern=False)
        a.mark(activation)


def _standalone(a: StageAnnotator, nodes: list[Node], targets: tuple[Any, ...]) -> None:
    for node in nodes:
        if node.target in targets and a.claim([node]):
            a.weighted(node, ends_pattern=True)


def _two_inputs(a: StageAnnotator, nodes: list[Node], target: Any, same_shape: bool) -> None:
    for node in nodes:
        if node.target != target or len(node.args) != 2:
            continue
        x, y = node.args
        if not (is_float_tensor(x) and is_float_tensor(y)):
            continue
        assert isinstance(x, Node) and isinstance(y, Node)
        if same_shape and x.meta["val"].shape != y.meta["val"].shape:
            continue
        if a.claim([node]):
            a.mark(node, {x: a.act, y: a.act})


# -- the steps (each annotates the rows that name it) -----------------------------------------------


def conv_bn(a: StageAnnotator, nodes: list[Node]) -> None:
    """QAT: conv2d -> batch norm, then add (+ relu), an activation, or nothing; in that
    order over the graph. The pattern's last node quantizes its output (the batch norm
    stays in the graph while training, so the next op's input is not the conv's)."""
    for kind in ("add_relu", "add", "unary", "alone"):
        for conv in nodes:
            if conv.target != CONV2D or len(conv.users) != 1:
                continue
            (bn,) = conv.users
            if bn.target != BATCH_NORM or bn.args[0] is not conv:
                continue
            if kind in ("add_relu", "add"):
                match = binary_partner(bn)
                if match is None:
                    continue
                add, other = match
                relu = first_user(add, RELU) if kind == "add_relu" else None
                if kind == "add_relu" and relu is None:
                    continue
                if not a.claim([conv, bn, add] + ([relu] if relu is not None else [])):
                    continue
                a.weighted(conv, ends_pattern=False)
                a.mark(bn, ends_pattern=False)
                a.mark(add, {other: a.act}, ends_pattern=relu is None, output=relu is None)
                if relu is not None:
                    a.mark(relu, output=True)
            elif kind == "unary":
                activation = first_user(bn, CONV_UNARY)
                if activation is None or not a.claim([conv, bn, activation]):
                    continue
                a.weighted(conv, ends_pattern=False)
                a.mark(bn, ends_pattern=False)
                a.mark(activation, output=True)
            elif a.claim([conv, bn]):
                a.weighted(conv, ends_pattern=False)
                a.mark(bn, output=True)


def conv_add_relu(a: StageAnnotator, nodes: list[Node]) -> None:
    _binary(a, nodes, (CONV2D,), with_relu=True, quantize_other=True)


def conv_add(a: StageAnnotator, nodes: list[Node]) -> None:
    _binary(a, nodes, (CONV2D,), with_relu=False, quantize_other=True)


def conv_unary(a: StageAnnotator, nodes: list[Node]) -> None:
    _unary(a, nodes, {CONV2D: CONV_UNARY, CONV1D: RELU})


def conv_alone(a: StageAnnotator, nodes: list[Node]) -> None:
    _standalone(a, nodes, (CONV2D, CONV1D))


def linear_add_relu(a: StageAnnotator, nodes: list[Node]) -> None:
    _binary(a, nodes, (LINEAR,), with_relu=True, quantize_other=False)


def linear_add(a: StageAnnotator, nodes: list[Node]) -> None:
    _binary(a, nodes, (LINEAR,), with_relu=False, quantize_other=False)


def linear_unary(a: StageAnnotator, nodes: list[Node]) -> None:
    _unary(a, nodes, {LINEAR: LINEAR_UNARY})


def linear_alone(a: StageAnnotator, nodes: list[Node]) -> None:
    _standalone(a, nodes, (LINEAR,))


def weight_matmuls(a: StageAnnotator, nodes: list[Node]) -> None:
    """addmm / mm / matmul of an activation and a constant [in, out] weight, as a linear: the
    weight per channel on its output axis (1), the bias float."""
    for node in nodes:
        found = weight_matmul(node)
        if found is None or not a.claim([node]):
            continue
        input_map: dict[Node, Any] = {found.x: a.act, found.weight: channel_axis_spec(a.weight)}
        if found.bias is not None:
            input_map[found.bias] = a.bias
        a.mark(node, input_map, ends_pattern=True)


def matmul(a: StageAnnotator, nodes: list[Node]) -> None:
    _two_inputs(a, nodes, MATMUL, same_shape=False)


def mul(a: StageAnnotator, nodes: list[Node]) -> None:
    _two_inputs(a, nodes, MUL, same_shape=True)


def propagate(a: StageAnnotator, nodes: list[Node]) -> None:
    """Pooling, cat and flatten after one of x86's own quantized patterns."""
    for node in nodes:
        if node.op != "call_function" or node.target not in PROPAGATE or is_annotated(node):
            continue
        inputs = node.all_input_nodes
        if not inputs:
            continue
        if node.target == CAT:
            if not all(ends_quantized_pattern(i) for i in inputs):
                continue
        else:
            if node.target == FLATTEN and node.users and not any(u.target in QUANTIZABLE for u in node.users):
                continue  # nothing quantized consumes the flattened tensor
            if not ends_quantized_pattern(inputs[0]):
                continue
        if not a.claim([node]):
            continue
        if node.target == CAT:
            first = inputs[0]
            shared = qw.SharedQuantizationSpec((first, node))
            input_map: dict[Node, Any] = {first: a.act}
            input_map.update({other: shared for other in inputs[1:]})
            a.mark(node, input_map)
        else:
            a.mark(node, {inputs[0]: a.act})


def share_outputs_of_int8_in_int8_out(gm: GraphModule) -> None:
    """Propagated ops produce int8 from int8: their output shares their input's observer."""
    for node in gm.graph.nodes:
        if calls(node, PROPAGATE) and ends_quantized_pattern(node) and node.all_input_nodes:
            node.meta[KEY].output_qspec = qw.SharedQuantizationSpec((node.all_input_nodes[0], node))

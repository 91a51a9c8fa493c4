"""The template quantizer: int8 conv2d and linear, written on quantweave's authoring kit.

``TABLE`` has one row per pattern the quantizer quantizes: its modes, how it is declared,
the step that annotates it and why a node of it stays float. The declaration
(``CAPABILITIES``), the annotation and the reasons ``quantweave.annotation_report`` shows
all come from it. Ops are compared as the pattern vocabulary names them (``node_op``):
``relu_`` is a relu, a conv with ``padding="same"`` is a conv2d.

Change the scheme to your backend's; keep the rows true: the conformance test
(tests/test_conformance.py) fails when the declaration and the annotations disagree, and
when anything is annotated where no declared pattern occurs.
"""

from __future__ import annotations

from functools import partial

import torch
from quantweave import QuantizationSpec
from quantweave.authoring import Rule, RuleTable, annotate_input_qspec_map, annotate_output_qspec, node_op, only_user
from quantweave.observers import HistogramObserver, PerChannelMinMaxObserver, PlaceholderObserver
from quantweave.plugin_api import (
    Capability,
    Mode,
    Quantizer,
    TensorQuant,
    is_annotated,
    mark_annotated,
    set_skip_reason,
)
from torch.fx import GraphModule, Node

NAME = "template"
CONV2D, LINEAR, RELU = "aten.conv2d.default", "aten.linear.default", "aten.relu.default"

ACT = TensorQuant("int8", -128, 127, "per_tensor", symmetric=True)
WEIGHT = TensorQuant("int8", -127, 127, "per_channel", symmetric=True, ch_axis=0)

STATIC_RELU = f"the {NAME} quantizer quantizes relu only fused after its conv2d / linear (conv2d_relu, linear_relu)"
DYNAMIC_RELU = "dynamic mode quantizes linear only, relu stays float"


def why_relu_float(node: Node, rule: str = STATIC_RELU) -> str | None:
    """Why a relu stayed float: ``rule``, and what the relu follows (None for other ops)."""
    if node_op(node) != RELU:
        return None
    producer = node.args[0] if node.args else None
    if not isinstance(producer, Node):
        return f"{rule}; its input is not a graph tensor"
    if producer.op != "call_function" or node_op(producer) not in (CONV2D, LINEAR):
        return f"{rule}; here it follows {producer.name}"
    if len(producer.users) > 1:
        return f"{rule}; its input {producer.name} has other users, so they are not fused"
    return f"{rule}; its input {producer.name} was not quantized by {NAME}"


def annotate_weighted(quantizer: TemplateQuantizer, model: GraphModule, op: str) -> None:
    """Inputs and weight of every ``op`` node not yet annotated; the output (static mode)
    after the relu that is its only user, else its own."""
    for node in model.graph.nodes:
        if node.op != "call_function" or node_op(node) != op or is_annotated(node):
            continue
        x, weight = node.args[0], node.args[1]
        if not isinstance(x, Node) or not isinstance(weight, Node):
            set_skip_reason(node, "its input or weight is not a graph tensor (the quantizer quantizes only those)")
            continue
        annotate_input_qspec_map(node, x, quantizer.act)
        annotate_input_qspec_map(node, weight, quantizer.weight)
        mark_annotated(node)
        if quantizer.is_dynamic:
            continue  # dynamic: outputs stay float
        user = only_user(node)
        if user is not None and node_op(user) == RELU:
            annotate_output_qspec(user, quantizer.act)
            mark_annotated(user)
        else:
            annotate_output_qspec(node, quantizer.act)


# The rows' steps, one per anchor op (the relu of a fused pattern is found from there).
annotate_conv2d = partial(annotate_weighted, op=CONV2D)
annotate_linear = partial(annotate_weighted, op=LINEAR)

# Each row: inputs and weight (axis 0) quantized, a float bias, the output with its own
# qparams (float in dynamic mode), and whether a fused pattern runs as one unit.
TABLE = RuleTable(
    NAME,
    [
        Rule("conv2d", annotate_conv2d, weighted=True, output="quantized"),
        Rule("conv2d_relu", annotate_conv2d, why_relu_float, weighted=True, output="quantized", fused=True),
        Rule("linear", annotate_linear, weighted=True, output="quantized", modes=(Mode.STATIC, Mode.DYNAMIC)),
        Rule("linear_relu", annotate_linear, why_relu_float, weighted=True, output="quantized", fused=True),
    ],
)
CAPABILITIES = TABLE.capabilities(Mode.STATIC, ACT, WEIGHT) + TABLE.capabilities(Mode.DYNAMIC, ACT, WEIGHT)


class TemplateQuantizer(Quantizer):
    """Static: conv2d / linear (+relu). Dynamic (``is_dynamic=True``): linear only."""

    name = NAME

    def __init__(self, is_dynamic: bool = False) -> None:
        if not isinstance(is_dynamic, bool):
            raise TypeError(f"{type(self).__name__}: is_dynamic must be a bool; got {is_dynamic!r}")
        self.is_dynamic = is_dynamic
        self.mode = Mode.DYNAMIC if is_dynamic else Mode.STATIC
        self.act = QuantizationSpec(
            dtype=torch.int8,
            quant_min=-128,
            quant_max=127,
            qscheme=torch.per_tensor_symmetric,
            is_dynamic=is_dynamic,
            observer_or_fake_quant_ctr=PlaceholderObserver if is_dynamic else HistogramObserver,
        )
        self.weight = QuantizationSpec(
            dtype=torch.int8,
            quant_min=-127,
            quant_max=127,
            qscheme=torch.per_channel_symmetric,
            ch_axis=0,
            observer_or_fake_quant_ctr=PerChannelMinMaxObserver,
        )

    def annotate(self, model: GraphModule) -> GraphModule:
        for step in TABLE.steps_for(self.mode):  # dynamic: annotate_linear only
            step(self, model)
        # a reason on every relu left float (one an earlier quantizer recorded is kept)
        TABLE.explain_float(model, (lambda node: why_relu_float(node, DYNAMIC_RELU)) if self.is_dynamic else None)
        return model

    def quantization_capabilities(self) -> tuple[Capability, ...]:
        return TABLE.capabilities(self.mode, ACT, WEIGHT)

    def __repr__(self) -> str:
        # name and configuration: what a user needs to tell two quantizers apart in a log
        return f"{type(self).__name__}(name={self.name!r}, is_dynamic={self.is_dynamic})"

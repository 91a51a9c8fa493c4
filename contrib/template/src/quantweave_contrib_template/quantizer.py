"""The template quantizer: int8 conv2d and linear, on quantweave's public API only.

Ops are compared as the pattern vocabulary knows them (``vocabulary_op``): ``relu_``
(``nn.ReLU(inplace=True)``) is a relu, a conv with ``padding="same"`` is a conv2d. Every
node of a declared op the quantizer leaves float gets a reason (``set_skip_reason``), which
``quantweave.annotation_report`` shows.

Change the scheme to your backend's; keep ``CAPABILITIES`` true: the conformance test
(tests/test_conformance.py) fails when the declaration and the annotations disagree, and
when anything is annotated where no declared pattern occurs.
"""

from __future__ import annotations

import quantweave as qw
import torch
from quantweave.capabilities import vocabulary_op
from quantweave.observers import HistogramObserver, PerChannelMinMaxObserver, PlaceholderObserver
from quantweave.plugin_api import (
    FLOAT,
    SKIP_REASON_KEY,
    Capability,
    Mode,
    Quant,
    TensorQuant,
    mark_annotated,
    set_skip_reason,
)
from torch.fx import GraphModule, Node

CONV2D, LINEAR, RELU = "aten.conv2d.default", "aten.linear.default", "aten.relu.default"

ACT = TensorQuant("int8", -128, 127, "per_tensor", symmetric=True)
WEIGHT = TensorQuant("int8", -127, 127, "per_channel", symmetric=True, ch_axis=0)
OWN = Quant.quantized(ACT)  # the output gets its own qparams

# What the whole pattern does: inputs, weight (axis 0), float bias, the output, and whether
# a fused pattern runs as one unit (no quantize/dequantize between conv and relu).
CAPABILITIES = (
    Capability("conv2d", Mode.STATIC, ACT, WEIGHT, output=OWN, bias=FLOAT),
    Capability("conv2d_relu", Mode.STATIC, ACT, WEIGHT, output=OWN, bias=FLOAT, fused=True),
    Capability("linear", Mode.STATIC, ACT, WEIGHT, output=OWN, bias=FLOAT),
    Capability("linear_relu", Mode.STATIC, ACT, WEIGHT, output=OWN, bias=FLOAT, fused=True),
    Capability("linear", Mode.DYNAMIC, ACT, WEIGHT, output=FLOAT, bias=FLOAT),
)


class TemplateQuantizer(qw.Quantizer):
    """Static: conv2d / linear (+relu). Dynamic (``is_dynamic=True``): linear only."""

    name = "template"

    def __init__(self, is_dynamic: bool = False) -> None:
        if not isinstance(is_dynamic, bool):
            raise TypeError(f"{type(self).__name__}: is_dynamic must be a bool; got {is_dynamic!r}")
        self.is_dynamic = is_dynamic
        self.act = qw.QuantizationSpec(
            dtype=torch.int8,
            quant_min=-128,
            quant_max=127,
            qscheme=torch.per_tensor_symmetric,
            is_dynamic=is_dynamic,
            observer_or_fake_quant_ctr=PlaceholderObserver if is_dynamic else HistogramObserver,
        )
        self.weight = qw.QuantizationSpec(
            dtype=torch.int8,
            quant_min=-127,
            quant_max=127,
            qscheme=torch.per_channel_symmetric,
            ch_axis=0,
            observer_or_fake_quant_ctr=PerChannelMinMaxObserver,
        )

    def annotate(self, model: GraphModule) -> GraphModule:
        targets = (LINEAR,) if self.is_dynamic else (LINEAR, CONV2D)
        for node in model.graph.nodes:
            if node.op != "call_function" or _op(node) not in targets or qw.is_annotated(node):
                continue
            self._annotate_weighted(node)
        self._explain_float(model)
        return model

    def _annotate_weighted(self, node: Node) -> None:
        x, weight = node.args[0], node.args[1]
        if not isinstance(x, Node) or not isinstance(weight, Node):
            set_skip_reason(node, "its input or weight is not a graph tensor (the quantizer quantizes only those)")
            return
        qw.annotate_input_qspec_map(node, x, self.act)
        qw.annotate_input_qspec_map(node, weight, self.weight)
        mark_annotated(node)
        if self.is_dynamic:
            return  # dynamic: outputs stay float
        users = list(node.users)
        if len(users) == 1 and _op(users[0]) == RELU:
            qw.annotate_output_qspec(users[0], self.act)
            mark_annotated(users[0])
        else:
            qw.annotate_output_qspec(node, self.act)

    def _explain_float(self, model: GraphModule) -> None:
        """A reason on every relu the quantizer leaves float (it declares relu only fused
        after its own conv2d / linear); a reason an earlier quantizer recorded is kept."""
        for node in model.graph.nodes:
            if node.op != "call_function" or _op(node) != RELU or qw.is_annotated(node):
                continue
            if isinstance(node.meta.get(SKIP_REASON_KEY), str):
                continue
            rule = (
                f"the {self.name} quantizer quantizes relu only fused after its conv2d / linear "
                "(conv2d_relu, linear_relu)"
            )
            if self.is_dynamic:
                rule = "dynamic mode quantizes linear only, relu stays float"
            producer = node.args[0] if node.args else None
            if not isinstance(producer, Node):
                set_skip_reason(node, f"{rule}; its input is not a graph tensor")
            elif producer.op != "call_function" or _op(producer) not in (CONV2D, LINEAR):
                set_skip_reason(node, f"{rule}; here it follows {producer.name}")
            elif len(producer.users) > 1:
                set_skip_reason(node, f"{rule}; its input {producer.name} has other users, so they are not fused")
            else:
                set_skip_reason(node, f"{rule}; its input {producer.name} was not quantized by {self.name}")

    def quantization_capabilities(self) -> tuple[Capability, ...]:
        mode = Mode.DYNAMIC if self.is_dynamic else Mode.STATIC
        return tuple(c for c in CAPABILITIES if c.mode is mode)

    def __repr__(self) -> str:
        # name and configuration: what a user needs to tell two quantizers apart in a log
        return f"{type(self).__name__}(name={self.name!r}, is_dynamic={self.is_dynamic})"


def _op(node: Node) -> str:
    """The op ``node`` computes, as the pattern vocabulary names it (in place or not)."""
    return vocabulary_op(str(node.target))

"""The LiteRT (TFLite) int8 scheme as a quantweave quantizer, on quantweave's public API only.

What LiteRT's int8 kernels expect (the TFLite quantization specification):

- activations int8 per-tensor *affine* in [-128, 127] (HistogramObserver, eps 2**-12);
- weights int8 *symmetric per-channel* in [-127, 127] along axis 0 (the output channels of
  conv2d and linear); biases stay float (the converter makes them int32 with scale
  input_scale * weight_scale);
- LOGISTIC (sigmoid) and SOFTMAX outputs have fixed qparams: scale 1/256, zero point -128;
- ops that only move or select values (max_pool2d, adaptive_avg_pool2d, flatten, reshape,
  view, and the inputs of cat) keep their input's qparams, so they share them;
- conv2d / linear / add followed by relu run as one op with a fused activation: the relu's
  output is quantized, the tensor between them is not.

Static patterns: conv2d, conv2d + relu, linear, linear + relu, add, add + relu, mul, cat,
sigmoid, softmax, and (only after one of this quantizer's own quantized outputs)
max_pool2d, adaptive_avg_pool2d, flatten, reshape, view. With ``is_dynamic=True`` the
quantizer annotates only the weights of linear (LiteRT's dynamic-range quantization: the
converter turns an int8-weight linear with float input into a FULLY_CONNECTED that
quantizes its input at run time); quantweave declares that mode ``weight_only``, because
the PT2E graph quantizes only the weight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.authoring import (
    Rule,
    RuleTable,
    activation_observer,
    annotate_input_qspec_map,
    annotate_output_qspec,
    calls,
    explain_float,
    is_float_tensor,
    only_user,
    weight_observer,
)
from quantweave.plugin_api import Capability, Mode, Quant, TensorQuant, is_annotated, mark_annotated, set_skip_reason

__all__ = ["CAPABILITIES", "FIXED_SCALE", "FIXED_ZERO_POINT", "LiteRTQuantizer", "LiteRTConversionMode"]

aten = torch.ops.aten

#: LOGISTIC and SOFTMAX outputs in LiteRT's int8 scheme
FIXED_SCALE = 1.0 / 256.0
FIXED_ZERO_POINT = -128

ACT = TensorQuant("int8", -128, 127, "per_tensor", symmetric=False)
WEIGHT = TensorQuant("int8", -127, 127, "per_channel", symmetric=True, ch_axis=0)
OWN = Quant.quantized(ACT)
FIXED = Quant.fixed(FIXED_SCALE, FIXED_ZERO_POINT, ACT)
SHARED = Quant.shared(0)


_CONV = frozenset((aten.conv2d.default, aten.conv2d.padding))
_LINEAR = frozenset((aten.linear.default,))
_ADD = frozenset((aten.add.Tensor,))
_MUL = frozenset((aten.mul.Tensor,))
_CAT = frozenset((aten.cat.default,))
_RELU = frozenset((aten.relu.default,))
_FIXED = frozenset((aten.sigmoid.default, aten.softmax.int, aten._softmax.default))
_SHARING = frozenset(
    (
        aten.max_pool2d.default,
        aten.adaptive_avg_pool2d.default,
        aten.flatten.using_ints,
        aten.reshape.default,
        aten.view.default,
    )
)


class LiteRTConversionMode:
    """What ``litert_torch``'s ``QuantConfig`` reads from the quantizer it is given
    (``quantizer.global_config.is_dynamic``: STATIC or DYNAMIC q/dq conversion)."""

    def __init__(self, is_dynamic: bool) -> None:
        self.is_dynamic = is_dynamic

    def __repr__(self) -> str:
        return f"LiteRTConversionMode(is_dynamic={self.is_dynamic})"


def _only_user(node: Node, targets: Iterable[Any]) -> Node | None:
    user = only_user(node)
    return user if user is not None and calls(user, tuple(targets)) else None


class LiteRTQuantizer(qw.Quantizer):
    """LiteRT int8: static (default) or, with ``is_dynamic=True``, dynamic-range linear
    (int8 weights only; declared as quantweave mode ``weight_only``)."""

    name = "litert"

    def __init__(self, is_dynamic: bool = False) -> None:
        if not isinstance(is_dynamic, bool):
            raise TypeError(f"LiteRTQuantizer: is_dynamic must be a bool; got {is_dynamic!r}")
        self.is_dynamic = is_dynamic
        # nodes whose output carries qparams this quantizer chose (filled by annotate)
        self._quantized: set[Node] = set()
        self.act = qw.QuantizationSpec(
            dtype=torch.int8,
            quant_min=-128,
            quant_max=127,
            qscheme=torch.per_tensor_affine,
            observer_or_fake_quant_ctr=activation_observer(),
        )
        self.weight = qw.QuantizationSpec(
            dtype=torch.int8,
            quant_min=-127,
            quant_max=127,
            qscheme=torch.per_channel_symmetric,
            ch_axis=0,
            observer_or_fake_quant_ctr=weight_observer(per_channel=True),
        )
        self.fixed = qw.FixedQParamsQuantizationSpec(
            dtype=torch.int8,
            scale=FIXED_SCALE,
            zero_point=FIXED_ZERO_POINT,
            quant_min=-128,
            quant_max=127,
            qscheme=torch.per_tensor_affine,
        )

    @property
    def global_config(self) -> LiteRTConversionMode:
        """Read by ``litert_torch.quantize.quant_config.QuantConfig`` to pick the converter's
        q/dq conversion mode (see :func:`quantweave_litert.to_tflite`)."""
        return LiteRTConversionMode(self.is_dynamic)

    def quantization_capabilities(self) -> tuple[Capability, ...]:
        mode = Mode.WEIGHT_ONLY if self.is_dynamic else Mode.STATIC
        return tuple(c for c in CAPABILITIES if c.mode is mode)

    @property
    def _table(self) -> RuleTable:
        return DYNAMIC if self.is_dynamic else STATIC

    # -- annotation ------------------------------------------------------------------------------

    def annotate(self, model: GraphModule) -> GraphModule:
        # nodes whose output carries qparams this quantizer chose, in graph order: an op that
        # shares its input's qparams is quantized only after one of them
        self._quantized = set()
        try:
            for node in list(model.graph.nodes):
                if node.op == "call_function" and not is_annotated(node):
                    self._annotate_node(node)
        finally:
            self._quantized = set()  # hold no reference to the graph
        explain_float(model, ["aten.relu.default"], _lone_relu_reason)
        return model

    def _annotate_node(self, node: Node) -> None:
        """The step of the row anchored on this node's op (one pass in graph order: an op
        that shares its input's qparams needs its producer annotated first)."""
        for step in self._table.steps:
            if node.target in _ANCHORS[step]:
                step(self, node)
                return

    def _input_spec(self, producer: Node) -> qw.QuantizationSpecBase:
        """The spec of an activation input edge: a tensor this quantizer already quantized
        keeps its qparams (no requantization); any other gets int8 activation qparams."""
        return qw.SharedQuantizationSpec(producer) if producer in self._quantized else self.act

    def _weighted(self, node: Node) -> None:
        x, weight = node.args[0], node.args[1] if len(node.args) > 1 else None
        if not (is_float_tensor(x) and isinstance(weight, Node) and is_float_tensor(node)):
            set_skip_reason(node, "litert: needs a float32 input and a weight tensor")
            return
        assert isinstance(x, Node)
        annotate_input_qspec_map(node, x, self._input_spec(x))
        annotate_input_qspec_map(node, weight, self.weight)
        self._quantize_output(node, _only_user(node, _RELU))

    def _weight_only(self, node: Node) -> None:
        weight = node.args[1] if len(node.args) > 1 else None
        if not (isinstance(weight, Node) and is_float_tensor(weight)):
            set_skip_reason(node, "litert (dynamic): needs a float32 weight tensor")
            return
        annotate_input_qspec_map(node, weight, self.weight)
        mark_annotated(node)

    def _binary(self, node: Node) -> None:
        operands = node.args[:2]
        if len(operands) != 2 or not all(is_float_tensor(a) for a in operands) or not is_float_tensor(node):
            set_skip_reason(node, "litert: add/mul are quantized when both operands are float32 tensors")
            return
        for operand in dict.fromkeys(operands):
            assert isinstance(operand, Node)
            annotate_input_qspec_map(node, operand, self._input_spec(operand))
        self._quantize_output(node, _only_user(node, _RELU) if node.target in _ADD else None)

    def _quantize_output(self, node: Node, relu: Node | None) -> None:
        """Quantize ``node``'s output, or, with a free ``relu`` as its only user, the relu's
        (a fused activation: the tensor between them stays unquantized)."""
        if relu is not None and not is_annotated(relu):
            annotate_output_qspec(relu, self.act)
            mark_annotated([node, relu])
            self._quantized.add(relu)
        else:
            annotate_output_qspec(node, self.act)
            mark_annotated(node)
            self._quantized.add(node)

    def _cat(self, node: Node) -> None:
        inputs = node.args[0]
        if not isinstance(inputs, (list, tuple)) or not inputs or not all(is_float_tensor(a) for a in inputs):
            set_skip_reason(node, "litert: cat is quantized when every input is a float32 tensor")
            return
        first = inputs[0]
        assert isinstance(first, Node)
        # LiteRT's CONCATENATION: every input and the output share one set of qparams
        annotate_input_qspec_map(node, first, self._input_spec(first))
        shared = qw.SharedQuantizationSpec((first, node))
        for other in dict.fromkeys(inputs[1:]):
            if other is not first:
                assert isinstance(other, Node)
                annotate_input_qspec_map(node, other, shared)
        annotate_output_qspec(node, shared)
        mark_annotated(node)
        self._quantized.add(node)

    def _fixed_output(self, node: Node) -> None:
        x = node.args[0]
        if not (is_float_tensor(x) and is_float_tensor(node)):
            set_skip_reason(node, "litert: needs a float32 input")
            return
        assert isinstance(x, Node)
        annotate_input_qspec_map(node, x, self._input_spec(x))
        annotate_output_qspec(node, self.fixed)  # LOGISTIC / SOFTMAX: scale 1/256, zero point -128
        mark_annotated(node)
        self._quantized.add(node)

    def _sharing(self, node: Node) -> None:
        x = node.args[0]
        if not isinstance(x, Node) or x not in self._quantized:
            reason = f"litert: {node.target} keeps its input's qparams, and its input is not quantized by litert"
            set_skip_reason(node, reason)
            return
        annotate_input_qspec_map(node, x, qw.SharedQuantizationSpec(x))
        annotate_output_qspec(node, qw.SharedQuantizationSpec((x, node)))
        mark_annotated(node)
        self._quantized.add(node)


# -- the rule tables: declaration and annotation steps from the same rows ---------------------------


def _lone_relu_reason(node: Node) -> str:
    producer = node.args[0] if node.args and isinstance(node.args[0], Node) else None
    after = f"its input '{producer.name}' ({producer.target})" if producer is not None else "its input"
    return (
        "litert: relu is quantized only fused into the conv2d / linear / add before it (the TFLite "
        f"converter's fused activation, patterns conv2d_relu / linear_relu / add_relu); {after} is not one "
        "of those, or has other users"
    )


_Step = Callable[[LiteRTQuantizer, Node], None]
_weighted, _binary, _cat = LiteRTQuantizer._weighted, LiteRTQuantizer._binary, LiteRTQuantizer._cat
_fixed, _sharing, _weight_only = LiteRTQuantizer._fixed_output, LiteRTQuantizer._sharing, LiteRTQuantizer._weight_only
#: the node targets each step is anchored on
_ANCHORS: dict[_Step, frozenset[Any]] = {
    _weighted: _CONV | _LINEAR,
    _binary: _ADD | _MUL,
    _cat: _CAT,
    _fixed: _FIXED,
    _sharing: _SHARING,
    _weight_only: _LINEAR,
}

STATIC = RuleTable(
    "litert",
    [
        Rule("conv2d", _weighted, weighted=True, output=OWN),
        Rule("conv2d_relu", _weighted, weighted=True, fused=True, output=OWN),
        Rule("linear", _weighted, weighted=True, output=OWN),
        Rule("linear_relu", _weighted, weighted=True, fused=True, output=OWN),
        Rule("add", _binary, output=OWN),
        Rule("add_relu", _binary, fused=True, output=OWN),
        Rule("mul", _binary, output=OWN),
        Rule("cat", _cat, output=SHARED),
        Rule("sigmoid", _fixed, output=FIXED),
        Rule("softmax", _fixed, output=FIXED),
        *(
            Rule(p, _sharing, output=SHARED, input_from="own")
            for p in ("max_pool2d", "adaptive_avg_pool2d", "flatten", "reshape", "view")
        ),
    ],
    steps=[_weighted, _binary, _cat, _fixed, _sharing],
)
#: dynamic-range linear: int8 weights only (declared ``weight_only``)
DYNAMIC = RuleTable(
    "litert", [Rule("linear", _weight_only, modes=(Mode.WEIGHT_ONLY,), weighted=True)], steps=[_weight_only]
)
CAPABILITIES: tuple[Capability, ...] = STATIC.capabilities(Mode.STATIC, ACT, WEIGHT) + DYNAMIC.capabilities(
    Mode.WEIGHT_ONLY, None, WEIGHT
)

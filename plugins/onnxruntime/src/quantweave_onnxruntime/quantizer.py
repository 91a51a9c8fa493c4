"""ONNX Runtime quantizer: the QDQ recipe of ``onnxruntime.quantization.quantize_static``, on aten ops.

ONNX Runtime turns a quantized ONNX model into int8 kernels by finding *node units*: an op
whose every tensor input comes from a ``DequantizeLinear`` and whose only output goes to a
``QuantizeLinear`` (DQ -> Conv -> Q becomes ``QLinearConv``, DQ -> Gemm -> Q ``QGemm``,
DQ -> Add -> Q ``QLinearAdd``...). The recipe therefore quantizes outputs, not only inputs:

- conv1d / conv2d / conv_transpose2d / linear: input (activation), weight (int8 symmetric,
  per output channel: axis 0, axis 1 for a transposed conv) and output; the bias stays float.
  A relu (conv2d: also hardtanh / relu6) that is the op's only user is folded into the
  output's range: the activation's output is quantized, the op's is not (ORT's
  ReluQuantFusion / ClipQuantFusion drop the relu / clip in front of the QuantizeLinear);
- add / mul (and a relu after them) / matmul: both inputs and their own output;
- cat: one range for all its inputs and its output (ORT's Concat shares qparams);
- max_pool2d, flatten, view, reshape, permute, transpose, squeeze, dropout: where their
  input is quantized (by any quantizer), input and output share its qparams (ORT drops the
  DQ / Q pair around them);
- avg_pool2d / adaptive_avg_pool2d: where their input is quantized, their own output.

Activations: uint8 [0, 255] affine (ORT's ``QuantType.QUInt8``) or, with
``activation_dtype="int8"``, int8 [-128, 127] affine (``QuantType.QInt8`` with ORT's default
``ActivationSymmetric=False``: ORT drops a relu / clip before a QuantizeLinear only when the
zero point is the lowest value; ``symmetric_activations=True``: int8 [-127, 127], zero point 0,
as ``ActivationSymmetric=True``, with no activation folded into an output range); HistogramObserver (``observer=
"minmax"``: MinMaxObserver, what ORT calibrates with by default). Weights: int8 [-127, 127]
symmetric (ORT's restricted symmetric range), per channel unless ``per_channel=False``;
``reduce_range=True``: in [-64, 64] (ORT's ``reduce_range``, for
CPUs without VNNI, whose u8 x s8 kernels saturate with full-range weights).

- sigmoid / softmax: their input and their own output (QLinearSigmoid, QLinearSoftmax);
- split: every output shares its input's qparams (ORT's Split unit needs one range); nearest /
  bilinear upsampling (ONNX Resize) shares its input's qparams too;
- layer norm is left float: ORT 1.32's CPU provider has no int8 LayerNormalization kernel
  (a DQ / Q pair around it would only add work; the next linear quantizes its input anyway).

Modes: post-training static (default); ``is_qat=True``: the same recipe through
fake-quantizers for ``prepare_qat_pt2e``, plus conv2d + batch norm (+ relu / clip), the batch
norm folded by ``convert_pt2e``; ``is_dynamic=True``: ORT's ``quantize_dynamic`` recipe for
transformers, linear and matmul with uint8 activations whose qparams are chosen at run time
(``DynamicQuantizeLinear`` -> ``MatMulInteger``) and float outputs.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave import authoring, plugin_api
from quantweave.authoring import calls, is_float_tensor, only_user
from quantweave.observers import (
    FakeQuantize,
    FusedMovingAvgObsFakeQuantize,
    HistogramObserver,
    MinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from quantweave.plugin_api import SKIP_REASON_KEY, Capability, is_annotated, mark_annotated, set_skip_reason

from ._capabilities import declared_capabilities, weight_range

__all__ = ["ORTQuantizer", "declared_capabilities"]

aten = torch.ops.aten

_RELU = (aten.relu.default, aten.relu_.default)
_CLIP = (aten.hardtanh.default, aten.hardtanh_.default, aten.relu6.default)
#: weighted op -> the activations folded into its output range
_WEIGHTED: dict[Any, tuple[Any, ...]] = {
    aten.conv1d.default: _RELU,
    aten.conv2d.default: _RELU + _CLIP,
    aten.conv_transpose2d.input: _RELU,
    aten.linear.default: _RELU,
    # padding="same" / "valid": the same convolution (ONNX Conv takes the padding either way)
    aten.conv1d.padding: _RELU,
    aten.conv2d.padding: _RELU + _CLIP,
}
_TRANSPOSED = (aten.conv_transpose2d.input,)
_BINARY = (aten.add.Tensor, aten.mul.Tensor)
_MATMUL = (aten.matmul.default,)
_CAT = (aten.cat.default,)
_SHARED = (
    aten.max_pool2d.default,
    aten.flatten.using_ints,
    aten.view.default,
    aten.reshape.default,
    aten.permute.default,
    aten.transpose.int,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.dropout.default,
    aten.upsample_nearest2d.vec,
    aten.upsample_bilinear2d.vec,
)
_SPLIT = (aten.split.Tensor,)
_UNARY_OWN = (aten.sigmoid.default, aten.softmax.int)
_BATCH_NORM = aten.batch_norm.default
_AVERAGING = (aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default)

_ACTIVATION_DTYPES = ("uint8", "int8")
_OBSERVERS = ("histogram", "minmax")


def _is_float32(arg: Any) -> bool:
    return is_float_tensor(arg)


def _has_output_qparams(node: Node) -> bool:
    annotation = node.meta.get(plugin_api.ANNOTATION_KEY)
    return annotation is not None and getattr(annotation, "output_qspec", None) is not None


def _split_source(arg: Any) -> Node | None:
    """For ``getitem(split(x), i)`` where this recipe quantized the split: ``x``."""
    if not (isinstance(arg, Node) and arg.op == "call_function" and arg.target is operator.getitem):
        return None
    split = arg.args[0]
    if not (isinstance(split, Node) and split.target in _SPLIT and is_annotated(split)):
        return None
    annotation = split.meta.get(plugin_api.ANNOTATION_KEY)
    source = split.args[0]
    if annotation is None or not isinstance(source, Node) or source not in annotation.input_qspec_map:
        return None
    return source


def _only_user(node: Node, targets: tuple[Any, ...]) -> Node | None:
    user = only_user(node)
    if user is not None and calls(user, targets) and user.args and user.args[0] is node:
        return user
    return None


class ORTQuantizer(qw.Quantizer):
    """ONNX Runtime's QDQ recipe (see the module docstring). Usable as built.

    ``activation_dtype``: ``"uint8"`` (default: affine [0, 255]) or ``"int8"`` (affine
    [-128, 127]); ``per_channel``: int8 weights per output channel (default) or per tensor;
    ``observer``: ``"histogram"`` (default) or ``"minmax"`` for the activations;
    ``reduce_range``: 7-bit weights, [-64, 64] (CPUs without VNNI).
    """

    name = "onnxruntime"

    def __init__(
        self,
        activation_dtype: str = "uint8",
        per_channel: bool = True,
        observer: str = "histogram",
        reduce_range: bool = False,
        is_dynamic: bool = False,
        is_qat: bool = False,
        symmetric_activations: bool = False,
    ) -> None:
        if activation_dtype not in _ACTIVATION_DTYPES:
            raise ValueError(
                f"ORTQuantizer: activation_dtype must be one of {', '.join(_ACTIVATION_DTYPES)}; "
                f"got {activation_dtype!r}"
            )
        flags = (
            ("per_channel", per_channel),
            ("reduce_range", reduce_range),
            ("is_dynamic", is_dynamic),
            ("is_qat", is_qat),
            ("symmetric_activations", symmetric_activations),
        )
        for option, value in flags:
            if not isinstance(value, bool):
                raise TypeError(f"ORTQuantizer: {option} must be a bool; got {value!r}")
        if observer not in _OBSERVERS:
            raise ValueError(f"ORTQuantizer: observer must be one of {', '.join(_OBSERVERS)}; got {observer!r}")
        if is_dynamic and is_qat:
            raise ValueError(
                "ORTQuantizer: is_dynamic and is_qat cannot both be True (ORT's dynamic path is post-training)"
            )
        if is_dynamic and activation_dtype != "uint8":
            raise ValueError(
                "ORTQuantizer: is_dynamic=True takes activation_dtype='uint8' only (ONNX DynamicQuantizeLinear "
                f"is uint8); got activation_dtype={activation_dtype!r}"
            )
        if symmetric_activations and activation_dtype != "int8":
            raise ValueError(
                "ORTQuantizer: symmetric_activations=True takes activation_dtype='int8' (ORT's QInt8 with "
                f"ActivationSymmetric); got activation_dtype={activation_dtype!r}"
            )
        self.symmetric_activations = symmetric_activations
        self.activation_dtype = activation_dtype
        self.per_channel = per_channel
        self.observer = observer
        self.reduce_range = reduce_range
        self.is_dynamic = is_dynamic
        self.is_qat = is_qat
        ctr: Any
        if is_qat:
            ctr = FusedMovingAvgObsFakeQuantize.with_args(eps=2**-12)
        elif is_dynamic:
            ctr = PlaceholderObserver.with_args(eps=2**-12)
        else:
            ctr = (HistogramObserver if observer == "histogram" else MinMaxObserver).with_args(eps=2**-12)
        if activation_dtype == "uint8":
            self.act = qw.QuantizationSpec(torch.uint8, ctr, 0, 255, torch.per_tensor_affine, is_dynamic=is_dynamic)
        elif symmetric_activations:
            self.act = qw.QuantizationSpec(torch.int8, ctr, -127, 127, torch.per_tensor_symmetric)
        else:
            self.act = qw.QuantizationSpec(torch.int8, ctr, -128, 127, torch.per_tensor_affine)
        self._weights = {axis: self._weight_spec(axis) for axis in (0, 1)}

    def _weight_spec(self, axis: int) -> qw.QuantizationSpec:
        lo, hi = weight_range(self.reduce_range)
        ctr: Any
        if self.per_channel:
            if self.is_qat:
                # torch's fused moving-average fake-quantizer is per-channel on axis 0 only
                fake_quant = FusedMovingAvgObsFakeQuantize if axis == 0 else FakeQuantize
                ctr = fake_quant.with_args(eps=2**-12, observer=MovingAveragePerChannelMinMaxObserver, ch_axis=axis)
            else:
                ctr = PerChannelMinMaxObserver.with_args(eps=2**-12)
            return qw.QuantizationSpec(torch.int8, ctr, lo, hi, torch.per_channel_symmetric, ch_axis=axis)
        if self.is_qat:
            ctr = FusedMovingAvgObsFakeQuantize.with_args(eps=2**-12)
        else:
            ctr = MinMaxObserver.with_args(eps=2**-12)
        return qw.QuantizationSpec(torch.int8, ctr, lo, hi, torch.per_tensor_symmetric)

    def quantization_capabilities(self) -> tuple[Capability, ...]:
        return declared_capabilities(
            activation_dtype=self.activation_dtype,
            per_channel=self.per_channel,
            reduce_range=self.reduce_range,
            is_dynamic=self.is_dynamic,
            is_qat=self.is_qat,
            symmetric_activations=self.symmetric_activations,
        )

    def __repr__(self) -> str:
        return (
            f"ORTQuantizer(activation_dtype={self.activation_dtype!r}, per_channel={self.per_channel}, "
            f"observer={self.observer!r}, reduce_range={self.reduce_range}, is_dynamic={self.is_dynamic}, "
            f"is_qat={self.is_qat}, symmetric_activations={self.symmetric_activations})"
        )

    # -- annotation --------------------------------------------------------------------------------

    def annotate(self, model: GraphModule) -> GraphModule:
        if self.is_dynamic:
            self._annotate_dynamic(model)
            return model
        if self.is_qat:
            for node in list(model.graph.nodes):
                if node.op == "call_function" and node.target in _WEIGHTED and not is_annotated(node):
                    self._conv_bn(node)
        # graph order is topological: a producer is annotated before the ops that share its qparams
        for node in list(model.graph.nodes):
            if node.op != "call_function" or is_annotated(node):
                continue
            target = node.target
            if target in _WEIGHTED:
                self._weighted(node)
            elif target in _BINARY:
                self._binary(node)
            elif target in _MATMUL:
                self._two_inputs(node, node)
            elif target in _CAT:
                self._cat(node)
            elif target in _SHARED:
                self._shared(node)
            elif target in _AVERAGING:
                self._averaging(node)
            elif target in _UNARY_OWN:
                self._unary_own(node)
            elif target in _SPLIT:
                self._split(node)
        self._explain_float(model)
        return model

    def _annotate_dynamic(self, model: GraphModule) -> None:
        """linear: dynamic input, int8 weight; matmul: both inputs dynamic; outputs float."""
        for node in list(model.graph.nodes):
            if node.op != "call_function" or is_annotated(node):
                continue
            if node.target == aten.linear.default:
                x, weight = node.args[0], node.args[1] if len(node.args) > 1 else None
                if not _is_float32(x) or not isinstance(weight, Node):
                    continue
                assert isinstance(x, Node)
                authoring.annotate_input_qspec_map(node, x, self.act)
                authoring.annotate_input_qspec_map(node, weight, self._weights[0])
                mark_annotated(node)
            elif node.target in _MATMUL:
                if len(node.args) < 2 or not all(_is_float32(a) for a in node.args[:2]):
                    continue
                for arg in node.args[:2]:
                    assert isinstance(arg, Node)
                    authoring.annotate_input_qspec_map(node, arg, self.act)
                mark_annotated(node)
        for node in model.graph.nodes:
            if node.op != "call_function" or is_annotated(node) or isinstance(node.meta.get(SKIP_REASON_KEY), str):
                continue
            if node.target == aten.linear.default or node.target in _MATMUL:
                set_skip_reason(node, f"{node.target}: dynamic quantization needs float32 tensor inputs")

    def _conv_bn(self, conv: Node) -> None:
        """QAT: conv2d -> batch norm (-> relu / clip): conv's input and weight, the last op's output."""
        if conv.target not in (aten.conv2d.default, aten.conv2d.padding):
            return
        bn = _only_user(conv, (_BATCH_NORM,))
        x, weight = conv.args[0], conv.args[1] if len(conv.args) > 1 else None
        if bn is None or is_annotated(bn) or not _is_float32(x) or not isinstance(weight, Node):
            return
        assert isinstance(x, Node)
        activation = None if self.symmetric_activations else _only_user(bn, _WEIGHTED[conv.target])
        if activation is not None and is_annotated(activation):
            activation = None
        authoring.annotate_input_qspec_map(conv, x, self._input_spec(x))
        authoring.annotate_input_qspec_map(conv, weight, self._weights[0])
        last = activation or bn
        authoring.annotate_output_qspec(last, self.act)
        mark_annotated([conv, bn] + ([activation] if activation is not None else []))

    def _unary_own(self, node: Node) -> None:
        x = node.args[0] if node.args else None
        if not _is_float32(x):
            return
        assert isinstance(x, Node)
        authoring.annotate_input_qspec_map(node, x, self._input_spec(x))
        authoring.annotate_output_qspec(node, self.act)
        mark_annotated(node)

    def _split(self, node: Node) -> None:
        """The input shares its producer's range; the outputs (getitem nodes) stay float here
        and every quantized consumer quantizes them with that same range (:meth:`_input_spec`),
        so ORT sees DQ -> Split -> Q with one range on every side."""
        x = self._quantized_input(node)
        if x is None:
            return
        authoring.annotate_input_qspec_map(node, x, qw.SharedQuantizationSpec(x))
        mark_annotated(node)

    def _input_spec(self, arg: Node) -> Any:
        """The spec of an activation input: a split output (getitem of a split this recipe
        quantized) shares the split input's range; anything else gets its own."""
        source = _split_source(arg)
        return self.act if source is None else qw.SharedQuantizationSpec(source)

    @staticmethod
    def _explain_float(model: GraphModule) -> None:
        """Why each op of the recipe stayed float (read by ``quantweave.annotation_report``); a
        reason an earlier quantizer of a composition recorded is kept."""
        for node in model.graph.nodes:
            if node.op != "call_function" or is_annotated(node) or isinstance(node.meta.get(SKIP_REASON_KEY), str):
                continue
            op = str(node.target).split(".")[1] if str(node.target).count(".") == 2 else str(node.target)
            if node.target in _WEIGHTED:
                reason = f"{op}: its input is not a float32 tensor or its weight is not a graph tensor"
            elif node.target in _BINARY + _MATMUL:
                reason = (
                    f"{op}: ORT's recipe quantizes it between two float32 tensors; "
                    "an operand is a scalar, a constant or not float32"
                )
            elif node.target in _CAT:
                reason = "cat: not every input is a float32 tensor"
            elif node.target in _UNARY_OWN:
                reason = f"{op}: its input is not a float32 tensor"
            elif node.target in _SHARED + _AVERAGING + _SPLIT:
                reason = f"{op}: its input is not quantized (ORT runs it on int8 data only after a quantized producer)"
            else:
                continue
            set_skip_reason(node, reason)

    def _weighted(self, node: Node) -> None:
        x = node.args[0]
        weight = node.args[1] if len(node.args) > 1 else None
        if not _is_float32(x) or not isinstance(weight, Node):
            return
        assert isinstance(x, Node)
        # symmetric activations: zero point 0 does not clamp at 0, ORT keeps the relu: no folding
        activation = None if self.symmetric_activations else _only_user(node, _WEIGHTED[node.target])
        if activation is not None and is_annotated(activation):  # claimed by an earlier quantizer
            activation = None
        axis = 1 if node.target in _TRANSPOSED else 0
        authoring.annotate_input_qspec_map(node, x, self._input_spec(x))
        authoring.annotate_input_qspec_map(node, weight, self._weights[axis])
        if activation is None:
            authoring.annotate_output_qspec(node, self.act)
            mark_annotated(node)
        else:
            authoring.annotate_output_qspec(activation, self.act)
            mark_annotated([node, activation])

    def _binary(self, node: Node) -> None:
        relu = None if self.symmetric_activations else _only_user(node, _RELU)
        if relu is not None and is_annotated(relu):
            relu = None
        self._two_inputs(node, relu or node)

    def _two_inputs(self, node: Node, last: Node) -> None:
        if len(node.args) < 2 or not all(_is_float32(a) for a in node.args[:2]):
            return
        for arg in node.args[:2]:
            assert isinstance(arg, Node)
            authoring.annotate_input_qspec_map(node, arg, self._input_spec(arg))
        authoring.annotate_output_qspec(last, self.act)
        mark_annotated([node] if last is node else [node, last])

    def _cat(self, node: Node) -> None:
        tensors = node.args[0] if node.args else None
        if not isinstance(tensors, (list, tuple)) or not tensors or not all(_is_float32(t) for t in tensors):
            return
        inputs: list[Node] = list(tensors)
        # one range for every input and the output, owned by the first quantized input
        owner = next((i for i in inputs if _has_output_qparams(i)), inputs[0])
        authoring.share_inputs(node, inputs, owner, self.act)
        mark_annotated(node)

    def _quantized_input(self, node: Node) -> Node | None:
        """The node whose quantized output ``node`` reads (a split output: the split's input)."""
        x = node.args[0] if node.args else None
        if isinstance(x, Node) and _is_float32(x) and _has_output_qparams(x):
            return x
        return _split_source(x) if isinstance(x, Node) else None

    def _shared(self, node: Node) -> None:
        x = self._quantized_input(node)
        if x is None:
            return
        shared = qw.SharedQuantizationSpec(x)
        authoring.annotate_input_qspec_map(node, x, shared)
        authoring.annotate_output_qspec(node, shared)
        mark_annotated(node)

    def _averaging(self, node: Node) -> None:
        x = self._quantized_input(node)
        if x is None:
            return
        authoring.annotate_input_qspec_map(node, x, qw.SharedQuantizationSpec(x))
        authoring.annotate_output_qspec(node, self.act)
        mark_annotated(node)

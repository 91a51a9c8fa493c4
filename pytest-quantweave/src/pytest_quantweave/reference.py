"""A reference quantizer written against the PT2E annotation API only.

It is written once against an *API namespace* (anything with the PT2E names:
``QuantizationSpec``, ``SharedQuantizationSpec``, ``FixedQParamsQuantizationSpec``,
``DerivedQuantizationSpec``, ``QuantizationAnnotation``, ``Quantizer`` and the observer
classes). With ``quantweave_api()`` it is a quantweave quantizer; the peer-parity tests and
benchmarks hand it torchao's names instead, so both flows see *the same annotation logic*.

What it annotates (static, uint8 per-tensor activations, int8 per-channel symmetric weights):
conv1d/conv2d/linear (+ a directly following relu/relu_), matmul/bmm, add/mul of two tensors,
cat (all inputs share the first input's observer), max_pool2d / avg_pool2d /
adaptive_avg_pool2d / flatten / reshape-like ops (output shares the input's observer when the
input is quantized), sigmoid (fixed qparams 1/256, 0). ``derived_bias=True`` adds an int32 bias
whose scale is ``act_scale * weight_scale``.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten

ANNOTATION_KEY = "quantization_annotation"

_WEIGHTED = (aten.conv1d.default, aten.conv2d.default, aten.linear.default)
_RELU = (aten.relu.default, aten.relu_.default)
_BINARY = (aten.add.Tensor, aten.mul.Tensor)
_MATMUL = (aten.matmul.default, aten.bmm.default)
_PROPAGATE = (
    aten.max_pool2d.default,
    aten.avg_pool2d.default,
    aten.adaptive_avg_pool2d.default,
    aten.flatten.using_ints,
)


def quantweave_api() -> types.SimpleNamespace:
    """The quantweave names the reference quantizer is written against."""
    import quantweave
    from quantweave import observers

    return _api(quantweave, observers)


def torchao_api() -> types.SimpleNamespace:
    """The same names from torchao (the peer), for parity tests and benchmarks only.

    Imports torchao when called; quantweave itself never needs it.
    """
    import torchao.quantization.pt2e.observer as observers
    import torchao.quantization.pt2e.quantizer as quantizer

    return _api(quantizer, observers)


def _api(quantizer_module: Any, observer_module: Any) -> types.SimpleNamespace:
    names = [
        "QuantizationSpec",
        "SharedQuantizationSpec",
        "FixedQParamsQuantizationSpec",
        "DerivedQuantizationSpec",
        "QuantizationAnnotation",
        "Quantizer",
    ]
    observers = ["MinMaxObserver", "HistogramObserver", "PerChannelMinMaxObserver"]
    return types.SimpleNamespace(
        **{name: getattr(quantizer_module, name) for name in names},
        **{name: getattr(observer_module, name) for name in observers},
    )


def _is_tensor(node: Any) -> bool:
    return isinstance(node, Node) and isinstance(node.meta.get("val"), torch.Tensor)


def _is_float_tensor(node: Any) -> bool:
    return _is_tensor(node) and node.meta["val"].is_floating_point()


def activation_spec(api: Any, observer: Any, *, signed: bool = False) -> Any:
    """A static per-tensor activation spec of ``api``'s: uint8 [0, 255] affine (the reference
    quantizer's), or with ``signed=True`` int8 [-128, 127] symmetric (the PT2E tutorial's).
    ``observer``: the observer or fake-quantize constructor. One home for the spec set-up the
    kit, tests/tutorial.py and tests/core/_distributed/scenarios.py share."""
    return api.QuantizationSpec(
        dtype=torch.int8 if signed else torch.uint8,
        quant_min=-128 if signed else 0,
        quant_max=127 if signed else 255,
        qscheme=torch.per_tensor_symmetric if signed else torch.per_tensor_affine,
        is_dynamic=False,
        observer_or_fake_quant_ctr=observer,
    )


def weight_spec(api: Any, observer: Any, *, narrow: bool = False, per_channel: bool = True) -> Any:
    """A static int8 symmetric weight spec of ``api``'s: per channel along axis 0 (or per tensor
    with ``per_channel=False``), [-128, 127] (or [-127, 127] with ``narrow=True``)."""
    return api.QuantizationSpec(
        dtype=torch.int8,
        quant_min=-127 if narrow else -128,
        quant_max=127,
        qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
        ch_axis=0 if per_channel else None,
        is_dynamic=False,
        observer_or_fake_quant_ctr=observer,
    )


class _Annotator:
    def __init__(self, api: Any, histogram: bool, derived_bias: bool) -> None:
        self.api = api
        act_observer = api.HistogramObserver if histogram else api.MinMaxObserver
        self.act = activation_spec(api, act_observer.with_args(eps=2**-12))
        self.weight = weight_spec(api, api.PerChannelMinMaxObserver.with_args(eps=2**-12))
        self.fixed_sigmoid = api.FixedQParamsQuantizationSpec(
            dtype=torch.uint8,
            scale=1.0 / 256.0,
            zero_point=0,
            quant_min=0,
            quant_max=255,
            qscheme=torch.per_tensor_affine,
        )
        self.derived_bias = derived_bias

    def annotation(self, node: Node) -> Any:
        ann = node.meta.get(ANNOTATION_KEY)
        if ann is None:
            ann = self.api.QuantizationAnnotation()
            node.meta[ANNOTATION_KEY] = ann
        return ann

    def claimed(self, *nodes: Node) -> bool:
        return any(getattr(n.meta.get(ANNOTATION_KEY), "_annotated", False) for n in nodes)

    def output_quantized(self, node: Node) -> bool:
        ann = node.meta.get(ANNOTATION_KEY)
        return ann is not None and ann.output_qspec is not None

    def run(self, gm: GraphModule) -> None:
        for node in gm.graph.nodes:
            if node.op != "call_function" or self.claimed(node):
                continue
            if node.target in _WEIGHTED:
                self.weighted(node)
            elif node.target in _MATMUL or node.target in _BINARY:
                self.binary(node)
            elif node.target is aten.cat.default:
                self.cat(node)
            elif node.target in _PROPAGATE:
                self.propagate(node)
            elif node.target is aten.sigmoid.default:
                self.sigmoid(node)

    def weighted(self, node: Node) -> None:
        x, w = node.args[0], node.args[1]
        bias = node.args[2] if len(node.args) > 2 else None
        if not (_is_float_tensor(x) and isinstance(w, Node)):
            return
        ann = self.annotation(node)
        ann.input_qspec_map[x] = self.act
        ann.input_qspec_map[w] = self.weight
        if self.derived_bias and isinstance(bias, Node):
            ann.input_qspec_map[bias] = self.api.DerivedQuantizationSpec(
                derived_from=[(x, node), (w, node)],
                derive_qparams_fn=_bias_qparams,
                dtype=torch.int32,
                quant_min=-(2**31),
                quant_max=2**31 - 1,
                qscheme=torch.per_channel_symmetric,
                ch_axis=0,
            )
        users = list(node.users)
        out = node
        if len(users) == 1 and users[0].target in _RELU and not self.claimed(users[0]):
            out = users[0]
            relu_ann = self.annotation(out)
            relu_ann._annotated = True
        self.annotation(out).output_qspec = self.act
        ann._annotated = True

    def binary(self, node: Node) -> None:
        a, b = node.args[0], node.args[1]
        if not (_is_float_tensor(a) and _is_float_tensor(b)):
            return
        ann = self.annotation(node)
        ann.input_qspec_map[a] = self.act
        ann.input_qspec_map[b] = self.act
        ann.output_qspec = self.act
        ann._annotated = True

    def cat(self, node: Node) -> None:
        inputs = node.args[0]
        if not isinstance(inputs, (list, tuple)) or not inputs:
            return
        if not all(_is_float_tensor(i) for i in inputs):
            return
        first = inputs[0]
        shared = self.api.SharedQuantizationSpec((first, node))
        ann = self.annotation(node)
        ann.input_qspec_map[first] = self.act
        for other in inputs[1:]:
            if other is not first:
                ann.input_qspec_map[other] = shared
        ann.output_qspec = shared
        ann._annotated = True

    def propagate(self, node: Node) -> None:
        x = node.args[0]
        if not (isinstance(x, Node) and self.output_quantized(x)):
            return
        ann = self.annotation(node)
        ann.input_qspec_map[x] = self.act
        ann.output_qspec = self.api.SharedQuantizationSpec((x, node))
        ann._annotated = True

    def sigmoid(self, node: Node) -> None:
        x = node.args[0]
        if not _is_float_tensor(x):
            return
        ann = self.annotation(node)
        ann.input_qspec_map[x] = self.act
        ann.output_qspec = self.fixed_sigmoid
        ann._annotated = True


def _bias_qparams(observers: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    act, weight = observers
    act_scale, _ = act.calculate_qparams()
    weight_scale, _ = weight.calculate_qparams()
    scale = (act_scale * weight_scale).float()
    return scale, torch.zeros_like(scale, dtype=torch.int64)


def make_reference_quantizer(api: Any | None = None, **options: Any) -> Any:
    """A quantizer instance of ``api.Quantizer`` running the reference annotation.

    options: ``histogram=False`` (use HistogramObserver for activations),
    ``derived_bias=False`` (int32 bias derived from activation and weight scales).
    """
    api = api or quantweave_api()
    histogram = bool(options.pop("histogram", False))
    derived_bias = bool(options.pop("derived_bias", False))
    if options:
        raise TypeError(f"unknown reference quantizer option(s): {sorted(options)}")

    class ReferenceQuantizer(api.Quantizer):  # type: ignore[name-defined]
        def annotate(self, model: GraphModule) -> GraphModule:
            _Annotator(api, histogram, derived_bias).run(model)
            return model

        def validate(self, model: GraphModule) -> None:
            return None

    return ReferenceQuantizer()


__all__ = ["make_reference_quantizer", "quantweave_api", "torchao_api"]

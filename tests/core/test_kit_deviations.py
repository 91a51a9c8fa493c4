"""Issue #9: every way a quantizer can break its declaration is reported, with the field named.

One honest NPU-style quantizer (uint8 activations, int8 per-channel weights on axis 0,
conv + relu fused, pooling sharing its input's qparams, sigmoid with fixed qparams,
dynamic linear) and a switch per deviation; each test turns one deviation on and reads
the kit's report."""

import pytest
import torch

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, annotate_output_qspec
from quantweave.observers import HistogramObserver, PerChannelMinMaxObserver, PlaceholderObserver
from quantweave.plugin_api import (
    FLOAT,
    Capability,
    Mode,
    Quant,
    QuantizerInfo,
    TensorQuant,
    is_annotated,
    mark_annotated,
)
from quantweave.testing.conformance import check_capability, check_conformance
from tests.helpers import assert_names

aten = torch.ops.aten
ACT = TensorQuant("uint8", 0, 255)
WEIGHT = TensorQuant("int8", -127, 127, "per_channel", symmetric=True, ch_axis=0)
SIGMOID_OUT = Quant.fixed(1 / 256, 0, ACT)

CAPS = (
    Capability("conv2d", "static", ACT, WEIGHT, output=Quant.quantized(ACT), bias=FLOAT),
    Capability("conv2d_relu", "static", ACT, WEIGHT, output=Quant.quantized(ACT), bias=FLOAT, fused=True),
    Capability("max_pool2d", "static", ACT, output=Quant.shared(0)),
    Capability("sigmoid", "static", ACT, output=SIGMOID_OUT),
    Capability("linear", "dynamic", ACT, WEIGHT, output=FLOAT, bias=FLOAT),
)


def act(dtype=torch.uint8, dynamic=False):
    observer = PlaceholderObserver if dynamic else HistogramObserver
    lo, hi = (0, 255) if dtype == torch.uint8 else (-128, 127)
    return qw.QuantizationSpec(dtype, observer, lo, hi, torch.per_tensor_affine, is_dynamic=dynamic)


def weight(axis=0):
    return qw.QuantizationSpec(torch.int8, PerChannelMinMaxObserver, -127, 127, torch.per_channel_symmetric, axis)


class Npu(qw.Quantizer):
    def __init__(self, is_dynamic=False, fault=None):
        self.is_dynamic, self.fault = is_dynamic, fault

    def quantization_capabilities(self):
        return tuple(c for c in CAPS if (c.mode is Mode.DYNAMIC) == self.is_dynamic)

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.op != "call_function" or is_annotated(node):
                continue
            if self.is_dynamic:
                if node.target == aten.linear.default:
                    self._weighted(node, act(dynamic=True))
                    if self.fault == "dynamic_output":
                        annotate_output_qspec(node, act())
                continue
            if node.target == aten.conv2d.default:
                self._conv(node)
            elif node.target == aten.max_pool2d.default and is_annotated(node.args[0]):
                annotate_input_qspec_map(node, node.args[0], act())
                out = act() if self.fault == "pool_own" else qw.SharedQuantizationSpec((node.args[0], node))
                annotate_output_qspec(node, out)
                mark_annotated(node)
            elif node.target == aten.sigmoid.default:
                annotate_input_qspec_map(node, node.args[0], act())
                if self.fault != "sigmoid_float":
                    scale = 1 / 128 if self.fault == "sigmoid_scale" else 1 / 256
                    annotate_output_qspec(node, qw.FixedQParamsQuantizationSpec(torch.uint8, scale, 0, 0, 255))
                mark_annotated(node)
            elif node.target == aten.relu.default and self.fault == "standalone_relu":
                annotate_input_qspec_map(node, node.args[0], act())
                annotate_output_qspec(node, act())
                mark_annotated(node)
        return model

    def _weighted(self, node, input_spec):
        annotate_input_qspec_map(node, node.args[0], input_spec)
        annotate_input_qspec_map(node, node.args[1], weight(1 if self.fault == "weight_axis" else 0))
        if self.fault != "unmarked":
            mark_annotated(node)

    def _conv(self, node):
        self._weighted(node, act())
        users = list(node.users)
        out_dtype = torch.int8 if self.fault == "conv_out_dtype" else torch.uint8
        if len(users) == 1 and users[0].target == aten.relu.default:
            relu = users[0]
            annotate_output_qspec(relu, act(out_dtype))
            mark_annotated(relu)
            if self.fault == "relu_not_fused":
                annotate_output_qspec(node, act())
        else:
            annotate_output_qspec(node, act(out_dtype))


def info(fault=None):
    return QuantizerInfo(
        "npu",
        lambda is_dynamic=False: Npu(is_dynamic, fault),
        CAPS,
        mode_options={"dynamic": {"is_dynamic": True}},
    )


def cap(pattern, mode="static"):
    return next(c for c in CAPS if c.pattern == pattern and c.mode.value == mode)


def report(fault, pattern, mode="static"):
    return [f.message for f in check_capability(info(fault), cap(pattern, mode), plugin="npu")]


def test_the_honest_quantizer_conforms():
    assert check_conformance(info(), plugin="npu") == []


@pytest.mark.parametrize(
    ("fault", "pattern", "mode", "expected"),
    [
        ("pool_own", "max_pool2d", "static", "output of 'max_pool2d': declared shared with input 0, annotated own"),
        ("sigmoid_float", "sigmoid", "static", "output of 'sigmoid': declared fixed scale=0.00390625 zero_point=0"),
        ("sigmoid_scale", "sigmoid", "static", "annotated fixed scale=0.0078125 zero_point=0"),
        (
            "conv_out_dtype",
            "conv2d",
            "static",
            "output of 'conv2d': declared own uint8[0,255] per_tensor affine, "
            "annotated own int8[-128,127] per_tensor affine",
        ),
        (
            "relu_not_fused",
            "conv2d_relu",
            "static",
            "fusion: declared conv2d + relu as one quantized unit, but the "
            "edge 'conv2d' -> 'relu' inside it is quantized",
        ),
        (
            "weight_axis",
            "conv2d",
            "static",
            "weight of 'conv2d': declared int8[-127,127] per_channel axis 0 sym, "
            "annotated int8[-127,127] per_channel axis 1 sym",
        ),
        ("dynamic_output", "linear", "dynamic", "output of 'linear': declared float, annotated own"),
        ("unmarked", "conv2d", "static", "'conv2d' carries quantization specs but is not marked annotated"),
    ],
)
def test_each_deviation_is_reported_with_the_field(fault, pattern, mode, expected):
    messages = report(fault, pattern, mode)
    assert any(expected in m for m in messages), messages


def test_a_standalone_op_is_not_covered_by_a_fused_pattern_containing_it():
    failures = check_conformance(info("standalone_relu"), plugin="npu")
    messages = [f"[{f.pattern}] {f.message}" for f in failures]
    assert any(
        m.startswith("[relu] annotates 'relu' (aten.relu.default) in mode static, but no declared pattern")
        for m in messages
    ), messages
    assert any(m.startswith("[<sweep>] annotates") for m in messages), messages


def test_a_dynamic_output_is_reported_even_when_the_declaration_does_not_state_it():
    api1 = Capability("linear", "dynamic", ACT, TensorQuant("int8", -127, 127, "per_channel", symmetric=True))
    old = QuantizerInfo(
        "npu",
        lambda is_dynamic=False: Npu(is_dynamic, "dynamic_output"),
        (api1,),
        mode_options={"dynamic": {"is_dynamic": True}},
    )
    messages = [f.message for f in check_capability(old, api1)]
    assert any("in mode dynamic an output stays float" in m for m in messages), messages


def test_api1_declarations_are_checked_with_the_fields_they_state():
    # no axis, output, bias or fusion stated: the honest quantizer passes, a wrong dtype still fails
    api1 = tuple(
        Capability(
            c.pattern,
            c.mode,
            c.activation,
            None if c.weight is None else TensorQuant("int8", -127, 127, "per_channel", True),
        )
        for c in CAPS
    )

    class Api1Npu(Npu):
        def quantization_capabilities(self):
            return tuple(c for c in api1 if (c.mode is Mode.DYNAMIC) == self.is_dynamic)

    honest = QuantizerInfo(
        "npu", lambda is_dynamic=False: Api1Npu(is_dynamic), api1, mode_options={"dynamic": {"is_dynamic": True}}
    )
    assert check_conformance(honest) == []
    wrong_axis = QuantizerInfo(
        "npu",
        lambda is_dynamic=False: Api1Npu(is_dynamic, "weight_axis"),
        api1,
        mode_options={"dynamic": {"is_dynamic": True}},
    )
    assert check_conformance(wrong_axis) == []  # the axis was not stated, so it is not held against it


def test_capabilities_round_trip_through_json_with_every_field():
    for c in CAPS:
        assert Capability.from_dict(c.to_dict()) == c
    assert cap("sigmoid").describe()["output"] == "fixed scale=0.00390625 zero_point=0 uint8[0,255] per_tensor affine"


def test_a_malformed_capability_says_what_was_expected():
    with pytest.raises(ValueError) as info:
        Capability("linear", "dynamic", ACT, output=Quant.quantized(ACT))
    assert_names(info, "dynamic", "output", "float")
    with pytest.raises(ValueError) as info:
        Quant("shared")
    assert_names(info, "Quant(shared)", "input")
    with pytest.raises(ValueError) as info:
        TensorQuant("uint8", 0, 255, ch_axis=1)
    assert_names(info, "ch_axis", "per-channel")
    with pytest.raises(ValueError) as info:
        Capability("linear", "static", ACT, bias=Quant.shared(0))
    assert_names(info, "bias", "shared")

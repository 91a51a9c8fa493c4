"""The conformance kit catches quantizers whose declarations are not the truth."""

import pytest
import torch

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, annotate_output_qspec
from quantweave.capabilities import Capability, TensorQuant
from quantweave.observers import MinMaxObserver
from quantweave.plugin_api import PatternSpec, hookimpl, mark_annotated
from quantweave.registry import QuantizerInfo
from quantweave.testing.conformance import PROBES, assert_conforms, check_capability, check_conformance, check_plugin
from quantweave.vocabulary import PATTERNS, core_vocabulary, export_probe
from tests.helpers import WEIGHTED_WEIGHT, assert_names

aten = torch.ops.aten
ACT = TensorQuant("uint8", 0, 255)
W = TensorQuant("int8", -128, 127, "per_channel", symmetric=True)


def act_spec(dtype=torch.uint8):
    return qw.QuantizationSpec(dtype=dtype, observer_or_fake_quant_ctr=MinMaxObserver, qscheme=torch.per_tensor_affine)


class LinearQuantizer(qw.Quantizer):
    """Annotates linear; optionally also add (undeclared) or with the wrong act dtype."""

    def __init__(self, act_dtype=torch.uint8, also_add=False, skip_linear=False):
        self.act = act_spec(act_dtype)
        self.also_add, self.skip_linear = also_add, skip_linear

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.target == aten.linear.default and not self.skip_linear:
                annotate_input_qspec_map(node, node.args[0], self.act)
                annotate_input_qspec_map(node, node.args[1], WEIGHTED_WEIGHT)
                annotate_output_qspec(node, self.act)
                mark_annotated(node)
            elif node.target == aten.add.Tensor and self.also_add:
                for arg in node.args[:2]:
                    annotate_input_qspec_map(node, arg, self.act)
        return model

    def quantization_capabilities(self):
        return (Capability("linear", "static", ACT, W),)


def info(**options):
    return QuantizerInfo("lin", lambda: LinearQuantizer(**options), (Capability("linear", "static", ACT, W),))


def test_every_vocabulary_pattern_has_a_probe_containing_its_ops():
    assert set(PROBES) == set(PATTERNS)
    vocabulary = core_vocabulary()
    for pattern, factory in PROBES.items():
        # the vocabulary's probe is this factory: its eval-mode export (once per process, shared
        # with the kit's checks below) is the factory's model exported
        assert vocabulary[pattern].probe is factory, pattern
        gm = export_probe(vocabulary[pattern]).graph_module
        targets = {str(n.target) for n in gm.graph.nodes}
        assert PATTERNS[pattern][1][0] in targets, pattern


def test_a_truthful_quantizer_conforms():
    assert_conforms(info())


def test_declared_but_not_delivered_is_reported():
    (failure,) = check_capability(info(skip_linear=True), info().capabilities[0])
    assert "'linear' (aten.linear.default) is not annotated" in str(failure)


def test_wrong_dtype_is_reported():
    failures = check_capability(info(act_dtype=torch.int8), info().capabilities[0])
    assert any(
        "activation input 'inputs_0' of 'linear': declared uint8[0,255] per_tensor affine, "
        "annotated int8[-128,127] per_tensor affine" in str(f)
        for f in failures
    )


def test_annotating_without_declaring_is_reported():
    failures = check_conformance(info(also_add=True))
    messages = [str(f) for f in failures]
    assert any("lin [add, static]: annotates 'add' (aten.add.Tensor)" in m for m in messages), messages
    with pytest.raises(AssertionError) as caught:
        assert_conforms(info(also_add=True))
    assert_names(caught, "conformance failure", "lin [add, static]", "'add' (aten.add.Tensor)")  # each failure listed


def test_a_quantizer_declaring_nothing_fails():
    empty = QuantizerInfo("empty", LinearQuantizer, ())
    assert [f.message for f in check_conformance(empty) if f.pattern == "-"] == ["declares no capabilities"]


def test_an_instance_that_disagrees_with_its_registered_declaration_is_reported():
    class Boastful(LinearQuantizer):
        def quantization_capabilities(self):
            return (Capability("linear", "static", ACT, W), Capability("add", "static", ACT))

    failures = check_conformance(QuantizerInfo("lin", Boastful, (Capability("linear", "static", ACT, W),)))
    assert [(f.pattern, f.mode) for f in failures] == [("add", "static")]
    assert "returned by the instance's quantization_capabilities() but not declared to the registry" in (
        failures[0].message
    )


def test_a_malformed_mode_option_is_a_reported_failure_not_a_type_error():
    caps = (Capability("linear", "static", ACT, W), Capability("linear", "dynamic", ACT, W))
    bad = QuantizerInfo("lin", LinearQuantizer, caps, mode_options={"dynamic": {"is_dynamc": True}})
    failures = check_conformance(bad)
    messages = [f.message for f in failures if f.mode == "dynamic"]
    assert messages and all(
        "factory(**{'is_dynamc': True}) (mode_options for 'dynamic') raised TypeError" in m for m in messages
    ), messages


def test_check_plugin_loads_the_plugin_and_checks_contributed_patterns():
    class Conv3dQuantizer(qw.Quantizer):
        def annotate(self, model):
            for node in model.graph.nodes:
                if node.target == aten.conv3d.default:
                    annotate_input_qspec_map(node, node.args[0], act_spec())
                    annotate_input_qspec_map(node, node.args[1], WEIGHTED_WEIGHT)
                    annotate_output_qspec(node, act_spec())
                    mark_annotated(node)
            return model

        def quantization_capabilities(self):
            return (Capability("conv3d", "static", ACT, W),)

    class Vendor:
        QUANTWEAVE_PLUGIN_API = 2

        @hookimpl
        def quantweave_patterns(self):
            probe = lambda: (torch.nn.Conv3d(2, 4, 3), (torch.randn(1, 2, 5, 5, 5),))  # noqa: E731
            return [PatternSpec("conv3d", "3-D convolution", ("aten.conv3d.default",), probe)]

        @hookimpl
        def quantweave_quantizers(self):
            return [QuantizerInfo("npu", Conv3dQuantizer, (Capability("conv3d", "static", ACT, W),))]

    assert check_plugin(Vendor(), "vendor") == []

    class WrongDtype(Conv3dQuantizer):
        def quantization_capabilities(self):
            return (Capability("conv3d", "static", TensorQuant("int8", -128, 127), W),)

    class Liar(Vendor):
        @hookimpl
        def quantweave_quantizers(self):
            return [
                QuantizerInfo("npu", WrongDtype, (Capability("conv3d", "static", TensorQuant("int8", -128, 127), W),))
            ]

    messages = [str(f) for f in check_plugin(Liar(), "vendor")]
    assert any("vendor:npu [conv3d, static]: activation input" in m and "declared int8" in m for m in messages), (
        messages
    )
    assert [str(f) for f in check_plugin(object(), "empty")] == [
        "empty:- [-, -]: the plugin did not load (failed): does not declare QUANTWEAVE_PLUGIN_API "
        "(the plugin-API version it targets)"
    ]

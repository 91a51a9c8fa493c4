"""quantweave-x86: the x86 recipe, its configuration API and its declared capabilities."""

import pytest
import torch
import torch.nn.functional as F

import quantweave as qw
from quantweave.capabilities import Mode
from quantweave.registry import PluginManager
from quantweave.report import SKIP_REASON_KEY, annotation_report
from quantweave.testing.conformance import assert_conforms, capability_cases, check_capability
from quantweave.testing.inspect import qdq_summary, sqnr
from quantweave.testing.models import calibration_batches, encoder_block, example_inputs, resnet18_like
from quantweave_x86 import X86InductorQuantizer, declared_capabilities, get_default_x86_inductor_quantization_config
from quantweave_x86 import plugin as x86_plugin
from tests.helpers import assert_names, export

aten = torch.ops.aten
KEY = "quantization_annotation"
(INFO,) = x86_plugin.quantweave_quantizers()


def annotate(model, *args, quantizer=None, strict=False):
    gm = torch.export.export(model.eval(), args, strict=strict).module()
    (quantizer or X86InductorQuantizer()).annotate(gm)
    return {n.name: n.meta[KEY] for n in gm.graph.nodes if KEY in n.meta}, gm


class ConvRelu(torch.nn.Module):
    def __init__(self, functional=True, conv=torch.nn.Conv2d):
        super().__init__()
        self.conv = conv(3, 8, 3)
        self.relu = torch.nn.ReLU()
        self.functional = functional

    def forward(self, x):
        y = self.conv(x)
        return F.max_pool2d(F.relu(y) if self.functional else self.relu(y), 2)


@pytest.mark.parametrize("cap", capability_cases(INFO))
def test_each_declared_capability_is_delivered(cap):
    assert check_capability(INFO, cap, plugin="x86") == []


@pytest.mark.slow  # a whole-vocabulary sweep (tox env slow)
def test_nothing_undeclared_is_annotated():
    assert_conforms(INFO, plugin="x86")


@pytest.mark.parametrize("functional", [True, False])
@pytest.mark.parametrize("strict", [False, True])
def test_conv_relu_maxpool_is_found_with_functional_or_module_relu_and_any_export(functional, strict):
    annotations, _ = annotate(ConvRelu(functional), torch.randn(1, 3, 10, 10), strict=strict)
    conv, relu, pool = annotations["conv2d"], annotations["relu"], annotations["max_pool2d"]
    assert conv.input_qspec_map and conv.output_qspec is None  # inputs quantized, output not
    assert relu._annotated and relu.is_output_of_quantized_pattern
    assert isinstance(pool.output_qspec, qw.SharedQuantizationSpec)


def test_conv1d_alone_and_with_relu_are_quantized():
    class C1(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv1d(4, 4, 3), torch.nn.Conv1d(4, 4, 3)

        def forward(self, x):
            return self.b(F.relu(self.a(x)))

    annotations, _ = annotate(C1(), torch.randn(1, 4, 16))
    assert set(annotations) == {"conv1d", "relu", "conv1d_1"}
    weights = [s for a in (annotations["conv1d"], annotations["conv1d_1"]) for s in a.input_qspec_map.values() if s]
    assert {s.dtype for s in weights} == {torch.uint8, torch.int8}


def test_conv_add_quantizes_the_extra_input_but_linear_add_does_not():
    class ConvAdd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = torch.nn.Conv2d(3, 3, 1), torch.nn.Linear(4, 4)

        def forward(self, x, y):
            return F.relu(self.conv(x) + y), self.fc(x) + x

    annotations, _ = annotate(ConvAdd(), torch.randn(1, 3, 4, 4), torch.randn(1, 3, 4, 4))
    assert [n.name for n in annotations["add"].input_qspec_map] == ["y"]
    assert annotations["relu"].is_output_of_quantized_pattern
    assert annotations["add_1"].input_qspec_map == {} and annotations["add_1"].is_output_of_quantized_pattern


def test_default_recipe_and_reduce_range():
    config = get_default_x86_inductor_quantization_config()
    assert (config.input_activation.dtype, config.input_activation.quant_max) == (torch.uint8, 255)
    assert config.weight.qscheme == torch.per_channel_symmetric and config.weight.quant_min == -128
    assert get_default_x86_inductor_quantization_config() is config
    annotations, _ = annotate(ConvRelu(), torch.randn(1, 3, 10, 10), quantizer=X86InductorQuantizer(reduce_range=True))
    assert {s.quant_max for s in annotations["conv2d"].input_qspec_map.values() if s and s.dtype == torch.uint8} == {
        127
    }
    caps = X86InductorQuantizer(reduce_range=True).quantization_capabilities()
    assert {c.activation.quant_max for c in caps} == {127}


def test_config_precedence_module_name_over_type_over_global_and_none_skips():
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc3(self.fc2(self.fc1(x)))

    reduced = get_default_x86_inductor_quantization_config(reduce_range=True)
    quantizer = (
        X86InductorQuantizer()
        .set_module_type_qconfig(torch.nn.Linear, reduced)
        .set_module_name_qconfig("fc2", None)
        .set_module_name_qconfig("fc3", get_default_x86_inductor_quantization_config())
    )
    annotations, gm = annotate(Two(), torch.randn(2, 4), quantizer=quantizer)

    def act_max(name):
        return next(s.quant_max for s in annotations[name].input_qspec_map.values() if s and s.dtype == torch.uint8)

    assert act_max("linear") == 127  # module type
    assert annotations["linear_1"].input_qspec_map == {}  # module name None
    assert act_max("linear_2") == 255  # module name beats module type
    skipped = next(n for n in gm.graph.nodes if n.name == "linear_1")
    assert skipped.meta[SKIP_REASON_KEY] == "module name 'fc2' configured None"
    prepared = qw.prepare_pt2e(export(Two(), torch.randn(2, 4)), quantizer)
    rows = {r.node: r for r in annotation_report(prepared, quantizer).nodes}
    assert (rows["linear_1"].reason, rows["linear_1"].kind) == (
        "skipped by x86: module name 'fc2' configured None",
        "skipped",
    )
    assert rows["linear"].quantizer == "x86"


def test_mixing_static_with_dynamic_is_rejected_with_the_setter_named():
    quantizer = X86InductorQuantizer()
    dynamic = get_default_x86_inductor_quantization_config(is_dynamic=True)
    with pytest.raises(ValueError) as info:
        quantizer.set_module_name_qconfig("fc", dynamic)
    assert_names(info, "set_module_name_qconfig", "static and dynamic", "is_dynamic=True", "is_dynamic=False")
    assert quantizer.set_global(dynamic).global_config is dynamic  # replacing the global is fine


def test_mixing_qat_with_post_training_is_rejected_with_the_setter_named():
    quantizer = X86InductorQuantizer(is_qat=True)
    with pytest.raises(ValueError) as info:
        quantizer.set_module_type_qconfig(torch.nn.Linear, get_default_x86_inductor_quantization_config())
    assert_names(info, "set_module_type_qconfig", "QAT and post-training", "is_qat=False", "is_qat=True")
    assert quantizer.operator_type_qconfig == {}  # the rejected config was not stored


def test_bad_options_and_unknown_operators_are_clear_errors():
    with pytest.raises(TypeError) as info:
        X86InductorQuantizer(is_dynamic="yes")
    assert_names(info, "X86InductorQuantizer", "is_dynamic", "bool", "'yes'")
    with pytest.raises(ValueError) as info:
        X86InductorQuantizer().set_function_type_qconfig(torch.sigmoid, None)
    assert_names(info, "set_function_type_qconfig", "sigmoid", "x86")
    with pytest.raises(TypeError) as info:
        X86InductorQuantizer().set_global({})
    assert_names(info, "set_global", "quantweave.QuantizationConfig", "dict")


def test_matmul_is_opt_in():
    class MM(torch.nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b)

    args = (torch.randn(2, 3, 4), torch.randn(2, 4, 5))
    assert annotate(MM(), *args)[0] == {}
    assert "matmul" in annotate(MM(), *args, quantizer=X86InductorQuantizer(enable_matmul=True))[0]
    via_config = X86InductorQuantizer().set_function_type_qconfig(
        torch.matmul, get_default_x86_inductor_quantization_config()
    )
    assert "matmul" in annotate(MM(), *args, quantizer=via_config)[0]
    assert "matmul" in {c.pattern for c in X86InductorQuantizer(enable_matmul=True).quantization_capabilities()}


@pytest.mark.parametrize("dynamic", [False, True])
def test_resnet_and_encoder_quantize_with_good_sqnr(dynamic):
    for model, floor in ((resnet18_like(width=8, num_classes=10), 25), (encoder_block(), 25)):
        x = example_inputs(model)
        prepared = qw.prepare_pt2e(export(model, *x), X86InductorQuantizer(is_dynamic=dynamic))
        for batch in calibration_batches(model, 4):
            prepared(*batch)
        converted = qw.convert_pt2e(prepared)
        assert len(qdq_summary(converted)) > 5
        assert sqnr(model(*x), converted(*x)) > floor


def test_the_plugin_registers_through_a_fresh_manager():
    pm = PluginManager(entry_points=[])
    assert pm.register("x86", x86_plugin).status == "loaded"
    quantizer = pm.get_quantizer("x86", is_dynamic=True)
    assert isinstance(quantizer, X86InductorQuantizer)
    assert {c.mode for c in pm.quantization_capabilities(plugin="x86")} == {Mode.STATIC, Mode.DYNAMIC, Mode.QAT}
    assert set(declared_capabilities()) <= set(INFO.capabilities)

"""quantweave-onnxruntime: the QDQ recipe (what is annotated, what shares qparams, options) and
its declared capabilities. Needs no onnx / onnxruntime (default env)."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import quantweave as qw
from quantweave.plugin_api import ANNOTATION_KEY, SKIP_REASON_KEY, Mode, QuantizerInfo, is_annotated
from quantweave.registry import PluginManager
from quantweave.testing.conformance import assert_conforms, capability_cases, check_capability
from quantweave_onnxruntime import ORTConfig, ORTQuantizer, declared_capabilities
from quantweave_onnxruntime import plugin as ort_plugin
from quantweave_onnxruntime.testing import CNN, MLP

KEY = ANNOTATION_KEY
(INFO,) = ort_plugin.quantweave_quantizers()
#: the patterns the plugin contributes (split, resize), which the conformance kit probes too
PATTERNS = {spec.name: spec for spec in ort_plugin.quantweave_patterns()}
aten = torch.ops.aten


def annotate(model, *args, quantizer=None):
    gm = torch.export.export(model.eval(), args).module()
    (quantizer or ORTQuantizer()).annotate(gm)
    by_op = {}
    for node in gm.graph.nodes:
        if KEY in node.meta:
            by_op.setdefault(node.target, []).append(node)
    return by_op, gm


@pytest.mark.parametrize("cap", capability_cases(INFO))
def test_each_declared_capability_is_delivered(cap):
    assert check_capability(INFO, cap, plugin="onnxruntime", patterns=PATTERNS) == []


def test_nothing_undeclared_is_annotated():
    assert_conforms(INFO, plugin="onnxruntime", patterns=PATTERNS)


@pytest.mark.parametrize(
    "options",
    [
        {"activation_dtype": "int8"},
        {"per_channel": False},
        {"reduce_range": True},
        {"activation_dtype": "int8", "symmetric_activations": True},
        {"activation_dtype": "int8", "symmetric_activations": True, "is_qat": True},
    ],
)
def test_options_are_declared_and_delivered(options):
    info = QuantizerInfo(
        name="onnxruntime",
        factory=lambda **mode: ORTQuantizer(**options),  # options already name the mode
        capabilities=declared_capabilities(**options),
        mode_options={"qat": {"is_qat": True}} if options.get("is_qat") else {},
    )
    assert_conforms(info, plugin="onnxruntime", patterns=PATTERNS)
    assert ORTQuantizer(**options).quantization_capabilities() == info.capabilities


@pytest.mark.parametrize("int32_bias", [True, False], ids=["int32-bias", "float-bias"])
def test_weighted_ops_quantize_their_output_and_fold_relu_into_it(int32_bias):
    by_op, _ = annotate(CNN(), torch.randn(1, 3, 16, 16), quantizer=ORTQuantizer(int32_bias=int32_bias))
    conv1, conv2, conv3 = by_op[aten.conv2d.default]
    relu1, relu2, _ = by_op[aten.relu.default]
    # conv + relu: the relu's output is quantized, the conv's is not (one DQ -> Conv -> Relu -> Q unit)
    for conv, relu in ((conv1, relu1), (conv2, relu2)):
        annotation = conv.meta[KEY]
        assert annotation.output_qspec is None and relu.meta[KEY].output_qspec is not None
        weight = annotation.input_qspec_map[conv.args[1]]
        assert (weight.dtype, weight.qscheme, weight.ch_axis) == (torch.int8, torch.per_channel_symmetric, 0)
        if not int32_bias:
            assert conv.args[2] not in annotation.input_qspec_map  # bias stays float
            continue
        # int32 bias as ORT's quantize_static writes it: scale = input scale x weight scale, zero point 0
        bias = annotation.input_qspec_map[conv.args[2]]
        assert isinstance(bias, qw.DerivedQuantizationSpec)
        assert (bias.dtype, bias.qscheme, bias.ch_axis) == (torch.int32, torch.per_channel_symmetric, 0)
        assert bias.derived_from == [(conv.args[0], conv), (conv.args[1], conv)]
    # conv alone: its own output
    assert conv3.meta[KEY].output_qspec.dtype == torch.uint8
    (linear,) = by_op[aten.linear.default]
    assert linear.meta[KEY].output_qspec.dtype == torch.uint8
    assert (linear.args[2] in linear.meta[KEY].input_qspec_map) is int32_bias  # 2-D input: ONNX Gemm


def test_int32_bias_scale_is_input_scale_times_weight_scale_after_convert():
    torch.manual_seed(0)
    model, x = CNN().eval(), torch.randn(2, 3, 16, 16)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), ORTQuantizer(observer="minmax"))
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    dequant = [n for n in converted.graph.nodes if "dequantize_per_channel" in str(n.target)]
    int32 = [n for n in dequant if n.args[-1] == torch.int32]
    assert len(int32) == 4  # three conv biases and the linear's
    for node in int32:
        user = next(iter(node.users))
        x_dq, w_dq = user.args[0], user.args[1]
        x_scale = float(x_dq.args[1])
        w_scale = getattr(converted, w_dq.args[1].target)
        b_scale = getattr(converted, node.args[1].target)
        torch.testing.assert_close(b_scale, (x_scale * w_scale).float())
        assert not getattr(converted, node.args[2].target).any()  # zero points 0


def test_a_3d_linear_and_a_grouped_transposed_conv_keep_a_float_bias_as_ort_does():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.ConvTranspose2d(4, 4, 2, groups=2)
            self.fc = torch.nn.Linear(5, 5)

        def forward(self, x):
            return self.fc(self.up(x).flatten(2)[..., :5])

    by_op, _ = annotate(Model(), torch.randn(1, 4, 4, 4))
    (up,) = by_op[aten.conv_transpose2d.input]
    (fc,) = by_op[aten.linear.default]
    assert up.args[2] not in up.meta[KEY].input_qspec_map and fc.args[2] not in fc.meta[KEY].input_qspec_map


def test_residual_add_has_its_own_output_and_pooling_shares_or_not_as_ort_does():
    by_op, _ = annotate(CNN(), torch.randn(1, 3, 16, 16))
    (add,) = by_op[aten.add.Tensor]
    assert len(add.meta[KEY].input_qspec_map) == 2
    relu_after_add = next(iter(add.users))
    assert add.meta[KEY].output_qspec is None and relu_after_add.meta[KEY].output_qspec.dtype == torch.uint8
    (pool,) = by_op[aten.max_pool2d.default]
    assert isinstance(pool.meta[KEY].output_qspec, qw.SharedQuantizationSpec)
    (avg,) = by_op[aten.adaptive_avg_pool2d.default]
    assert isinstance(avg.meta[KEY].output_qspec, qw.QuantizationSpec)  # QLinearGlobalAveragePool: own range
    (flatten,) = by_op[aten.flatten.using_ints]
    assert isinstance(flatten.meta[KEY].output_qspec, qw.SharedQuantizationSpec)


def test_shared_ops_end_up_with_their_inputs_qparams_after_convert():
    class Shapes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(3, 4, 3)
            self.b = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            y = torch.cat([self.a(x), self.b(x)], 1)
            return y.permute(0, 2, 3, 1).reshape(1, -1)

    model, x = Shapes().eval(), torch.randn(1, 3, 8, 8)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), ORTQuantizer(observer="minmax"))
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    qparams = {
        (float(n.args[1]), int(n.args[2]))
        for n in converted.graph.nodes
        if n.target == torch.ops.quantized_decomposed.quantize_per_tensor.default and n.args[0].op != "placeholder"
    }
    assert len(qparams) == 1  # both convs, the cat, the permute and the reshape: one range


def test_ops_left_alone():
    class Float(torch.nn.Module):
        def forward(self, x):
            return torch.flatten(F.max_pool2d(x, 2), 1).tanh()  # nothing quantized feeds the pool

    by_op, gm = annotate(Float(), torch.randn(1, 3, 8, 8))
    assert by_op == {}
    reasons = {n.name: n.meta.get(SKIP_REASON_KEY) for n in gm.graph.nodes}
    assert "input is not quantized" in reasons["max_pool2d"] and "max_pool2d" in reasons["max_pool2d"]


def test_int8_activations_are_affine_as_ort_quint8_and_qint8_are():
    by_op, _ = annotate(CNN(), torch.randn(1, 3, 16, 16), quantizer=ORTQuantizer(activation_dtype="int8"))
    spec = by_op[aten.linear.default][0].meta[KEY].output_qspec
    assert (spec.dtype, spec.qscheme, spec.quant_min, spec.quant_max) == (
        torch.int8,
        torch.per_tensor_affine,
        -128,
        127,
    )


def test_bad_options_name_the_option():
    with pytest.raises(ValueError, match="activation_dtype"):
        ORTQuantizer(activation_dtype="int4")
    with pytest.raises(TypeError, match="per_channel"):
        ORTQuantizer(per_channel="yes")
    with pytest.raises(TypeError, match="reduce_range"):
        ORTQuantizer(reduce_range=1)
    with pytest.raises(ValueError, match="observer"):
        ORTQuantizer(observer="entropy")


def test_caller_model_is_not_modified_and_sqnr_is_good():
    torch.manual_seed(0)
    model, x = CNN().eval(), torch.randn(2, 3, 16, 16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), ORTQuantizer())
    for _ in range(3):
        prepared(torch.randn(2, 3, 16, 16))
    out = qw.convert_pt2e(prepared)(x)
    expected = model(x)
    sqnr = 10 * torch.log10(expected.pow(2).mean() / (expected - out).pow(2).mean())
    assert sqnr > 25
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_plugin_registers_through_a_fresh_manager_without_importing_onnxruntime():
    pm = PluginManager(entry_points=[])
    assert pm.register("onnxruntime", ort_plugin).status == "loaded"
    assert isinstance(pm.get_quantizer("onnxruntime", activation_dtype="int8"), ORTQuantizer)
    # loading the plugin and building a quantizer imports neither onnx nor onnxruntime (fresh interpreter)
    code = (
        "import sys, quantweave_onnxruntime.plugin as p; p.quantweave_quantizers(); p.make_quantizer(); "
        "print(sorted(m for m in ('onnx', 'onnxruntime', 'onnxscript') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_conv_with_string_padding_is_quantized_like_any_conv():
    class Same(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding="same")

        def forward(self, x):
            return F.relu(self.conv(x))

    by_op, _ = annotate(Same(), torch.randn(1, 3, 8, 8))
    (conv,) = by_op[aten.conv2d.padding]
    (relu,) = by_op[aten.relu.default]
    # input, weight and the int32 bias, as for any conv
    assert len(conv.meta[KEY].input_qspec_map) == 3 and relu.meta[KEY].output_qspec is not None


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.sigmoid(torch.matmul(self.q(x), self.k(x).transpose(-1, -2)))


class _TimesWeight(torch.nn.Module):
    """x @ W with W a parameter, then x @ W.t() (a constant through a transpose)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return torch.matmul(torch.matmul(x, self.w), self.w.t())


def test_dynamic_mode_quantizes_linear_and_matmul_inputs_at_run_time_and_leaves_outputs_float():
    quantizer = ORTQuantizer(is_dynamic=True, matmul_const_b_only=False)
    assert quantizer.matmul_const_b_only is False
    by_op, _ = annotate(_Attention(), torch.randn(2, 4, 8), quantizer=quantizer)
    assert set(by_op) == {aten.linear.default, aten.matmul.default}  # sigmoid stays float in dynamic mode
    for node in by_op[aten.linear.default] + by_op[aten.matmul.default]:
        annotation = node.meta[KEY]
        assert annotation.output_qspec is None
        act = annotation.input_qspec_map[node.args[0]]
        assert act.is_dynamic and act.dtype == torch.uint8
    (linear, _) = by_op[aten.linear.default]
    assert not linear.meta[KEY].input_qspec_map[linear.args[1]].is_dynamic  # the weight: int8, observed once


def test_dynamic_mode_leaves_activation_times_activation_matmuls_float_as_quantize_dynamic():
    """ORT's quantize_dynamic sets MatMulConstBOnly: a matmul whose B is computed stays float;
    the report names the operand and the option."""
    quantizer = ORTQuantizer(is_dynamic=True)
    assert quantizer.matmul_const_b_only is True
    by_op, gm = annotate(_Attention(), torch.randn(2, 4, 8), quantizer=quantizer)
    assert set(by_op) == {aten.linear.default}
    (matmul,) = [n for n in gm.graph.nodes if n.target == aten.matmul.default]
    assert not is_annotated(matmul)
    reason = matmul.meta[qw.plugin_api.SKIP_REASON_KEY]
    assert f"'{matmul.args[1].name}'" in reason and "matmul_const_b_only" in reason
    # a constant B (a parameter, or its transpose) is quantized as before
    by_op, _ = annotate(_TimesWeight(), torch.randn(2, 4, 8), quantizer=quantizer)
    assert len(by_op[aten.matmul.default]) == 2
    for node in by_op[aten.matmul.default]:
        assert node.meta[KEY].input_qspec_map[node.args[0]].is_dynamic


def test_static_mode_quantizes_activation_matmuls_unless_matmul_const_b_only():
    assert ORTQuantizer().matmul_const_b_only is False  # quantize_static's default
    by_op, _ = annotate(_Attention(), torch.randn(2, 4, 8), quantizer=ORTQuantizer())
    assert len(by_op[aten.matmul.default]) == 1
    by_op, gm = annotate(_Attention(), torch.randn(2, 4, 8), quantizer=ORTQuantizer(matmul_const_b_only=True))
    assert aten.matmul.default not in by_op and len(by_op[aten.linear.default]) == 2
    (matmul,) = [n for n in gm.graph.nodes if n.target == aten.matmul.default]
    assert "matmul_const_b_only" in matmul.meta[qw.plugin_api.SKIP_REASON_KEY]
    with pytest.raises(TypeError, match="matmul_const_b_only"):
        ORTQuantizer(matmul_const_b_only="yes")
    assert "matmul_const_b_only=True" in repr(ORTQuantizer(matmul_const_b_only=True))


@pytest.mark.parametrize("matmul_const_b_only", [None, False, True])
def test_matmul_const_b_only_is_declared_and_delivered(matmul_const_b_only):
    options = {"is_dynamic": True, "matmul_const_b_only": matmul_const_b_only}
    info = QuantizerInfo(
        name="onnxruntime",
        factory=lambda **mode: ORTQuantizer(**options),
        capabilities=declared_capabilities(**options),
        mode_options={"dynamic": {"is_dynamic": True}},
    )
    patterns = {c.pattern for c in info.capabilities}
    assert ("matmul" in patterns) is (matmul_const_b_only is False)
    assert ("matmul_weight" in patterns) is (matmul_const_b_only is not False)
    for cap in info.capabilities:
        assert check_capability(info, cap, plugin="onnxruntime", patterns=PATTERNS) == [], cap.pattern


def test_dynamic_and_qat_options_are_checked_and_reachable_by_mode():
    with pytest.raises(ValueError, match="activation_dtype"):
        ORTQuantizer(is_dynamic=True, activation_dtype="int8")
    with pytest.raises(ValueError, match="is_qat"):
        ORTQuantizer(is_dynamic=True, is_qat=True)
    with pytest.raises(TypeError, match="is_dynamic"):
        ORTQuantizer(is_dynamic="yes")
    assert INFO.mode_options == {"dynamic": {"is_dynamic": True}, "qat": {"is_qat": True}}
    assert {c.mode for c in INFO.capabilities} == {Mode.STATIC, Mode.DYNAMIC, Mode.QAT}


def test_split_outputs_are_quantized_by_their_consumers_with_the_split_inputs_range():
    class Split(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2, self.c3 = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(4, 4, 3), torch.nn.Conv2d(4, 4, 3)

        def forward(self, x):
            a, b = torch.split(self.c1(x), 4, dim=1)
            return self.c2(a), self.c3(b)

    model, x = Split().eval(), torch.randn(1, 3, 12, 12)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), ORTQuantizer(observer="minmax"))
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    conv1 = next(n for n in converted.graph.nodes if n.target == aten.conv2d.default)
    split = next(n for n in converted.graph.nodes if n.target == aten.split.Tensor)
    after_conv1 = {(float(n.args[1]), int(n.args[2])) for n in conv1.users if n.target == quantize}
    after_split = {
        (float(q.args[1]), int(q.args[2])) for item in split.users for q in item.users if q.target == quantize
    }
    assert len(after_conv1) == 1 and after_split == after_conv1  # ORT's Split unit: one range in and out


def test_qat_annotates_conv_batch_norm_relu_as_one_unit():
    class ConvBNReLU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)

        def forward(self, x):
            return F.relu(self.bn(self.conv(x)))

    gm = torch.export.export(ConvBNReLU().train(), (torch.randn(2, 3, 8, 8),)).module()
    ORTQuantizer(is_qat=True).annotate(gm)
    conv = next(n for n in gm.graph.nodes if n.target == aten.conv2d.default)
    bn = next(n for n in gm.graph.nodes if n.target == aten.batch_norm.default)
    relu = next(n for n in gm.graph.nodes if n.target == aten.relu.default)
    assert conv.meta[KEY].output_qspec is None and bn.meta[KEY].output_qspec is None
    assert relu.meta[KEY].output_qspec is not None
    weight = conv.meta[KEY].input_qspec_map[conv.args[1]]
    assert "FakeQuantize" in repr(weight.observer_or_fake_quant_ctr)


def test_to_onnx_and_export_onnx_are_one_function():
    import quantweave_onnxruntime

    assert quantweave_onnxruntime.to_onnx is quantweave_onnxruntime.export_onnx


def test_symmetric_int8_activations_quantize_each_output_and_fold_no_relu():
    quantizer = ORTQuantizer(activation_dtype="int8", symmetric_activations=True)
    by_op, _ = annotate(CNN(), torch.randn(1, 3, 16, 16), quantizer=quantizer)
    conv1 = by_op[aten.conv2d.default][0]
    spec = conv1.meta[KEY].output_qspec  # the conv quantizes its own output; the relu is not folded
    assert (spec.dtype, spec.qscheme, spec.quant_min, spec.quant_max) == (
        torch.int8,
        torch.per_tensor_symmetric,
        -127,
        127,
    )
    assert aten.relu.default not in by_op
    with pytest.raises(ValueError, match="symmetric_activations"):
        ORTQuantizer(symmetric_activations=True)  # uint8 activations


# -- per-module configs ------------------------------------------------------------------------------


def test_a_module_configured_none_stays_float_and_the_report_names_the_module():
    from quantweave_onnxruntime import ORTConfig  # noqa: F401  (exported)

    by_op, gm = annotate(CNN(), torch.randn(1, 3, 16, 16), quantizer=ORTQuantizer().set_module_name("fc", None))
    (linear,) = [n for n in gm.graph.nodes if n.target == aten.linear.default]
    assert not linear.meta[KEY].input_qspec_map and linear.meta[KEY].output_qspec is None
    assert "'fc'" in linear.meta[qw.plugin_api.SKIP_REASON_KEY]
    assert len(by_op[aten.conv2d.default]) == 3  # the rest is quantized as before
    assert by_op[aten.conv2d.default][0].meta[KEY].input_qspec_map


def test_module_type_and_operator_type_configs_choose_the_recipe_per_op():
    from quantweave_onnxruntime import ORTConfig

    int8 = ORTConfig(activation_dtype="int8", per_channel=False)
    quantizer = ORTQuantizer().set_module_type(torch.nn.Conv2d, int8).set_operator_type(aten.linear.default, None)
    by_op, gm = annotate(CNN(), torch.randn(1, 3, 16, 16), quantizer=quantizer)
    conv1 = by_op[aten.conv2d.default][0]
    x, weight = conv1.args[0], conv1.args[1]
    assert conv1.meta[KEY].input_qspec_map[x].dtype == torch.int8
    assert conv1.meta[KEY].input_qspec_map[weight].qscheme == torch.per_tensor_symmetric
    # the conv decides its unit: the functional relu after it (outside the Conv2d) is folded in
    relu1 = by_op[aten.relu.default][0]
    assert conv1.meta[KEY].output_qspec is None and relu1.meta[KEY].output_qspec.dtype == torch.int8
    (add,) = by_op[aten.add.Tensor]  # outside every Conv2d: the global uint8 config
    assert next(iter(add.users)).meta[KEY].output_qspec.dtype == torch.uint8
    (linear,) = [n for n in gm.graph.nodes if n.target == aten.linear.default]
    assert "operator type" in linear.meta[qw.plugin_api.SKIP_REASON_KEY]
    assert not linear.meta[KEY].input_qspec_map


def test_a_global_config_of_none_leaves_everything_to_other_quantizers():
    quantizer = ORTQuantizer().set_global(None)
    assert quantizer.quantization_capabilities() == ()
    by_op, _ = annotate(CNN(), torch.randn(1, 3, 16, 16), quantizer=quantizer)
    assert by_op == {}


def test_bad_configs_name_the_setter_and_what_was_got():
    from quantweave_onnxruntime import ORTConfig

    with pytest.raises(TypeError, match=r"set_module_name.*ORTConfig.*dict"):
        ORTQuantizer().set_module_name("fc", {"activation_dtype": "int8"})
    with pytest.raises(ValueError, match=r"set_operator_type.*aten\.embedding"):
        ORTQuantizer().set_operator_type(aten.embedding.default, ORTConfig())
    with pytest.raises(TypeError, match="set_operator_type"):
        ORTQuantizer().set_operator_type("linear", ORTConfig())
    with pytest.raises(ValueError, match=r"set_module_type.*activation_dtype='int8'"):
        ORTQuantizer(is_dynamic=True).set_module_type(torch.nn.Linear, ORTConfig(activation_dtype="int8"))
    with pytest.raises(ValueError, match="activation_dtype"):
        ORTConfig(activation_dtype="int4")
    with pytest.raises(ValueError, match="module_name"):
        ORTQuantizer().set_module_name("", None)


def test_an_unknown_module_name_warns_naming_it():
    with pytest.warns(UserWarning, match="nowhere"):
        annotate(CNN(), torch.randn(1, 3, 16, 16), quantizer=ORTQuantizer().set_module_name("nowhere", None))


def test_the_default_observer_is_minmax_and_histogram_stays_available():
    """MinMax is quantize_static's default calibration (CalibrationMethod.MinMax), for every
    activation dtype; the histogram observer is an option."""
    assert ORTQuantizer(activation_dtype="int8", symmetric_activations=True).observer == "minmax"
    assert ORTQuantizer().observer == "minmax"
    assert ORTConfig().observer == "minmax" and ORTConfig() == ORTConfig(observer="minmax")
    explicit = ORTQuantizer(activation_dtype="int8", symmetric_activations=True, observer="histogram")
    assert explicit.observer == "histogram"
    assert ORTQuantizer(observer="histogram").observer == "histogram"


@pytest.mark.parametrize(("observer", "expected"), [(None, "MinMaxObserver"), ("histogram", "HistogramObserver")])
def test_the_prepared_model_observes_activations_with_the_chosen_observer(observer, expected):
    model, x = MLP().eval(), torch.randn(4, 64)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), ORTQuantizer(observer=observer))
    kinds = {type(m).__name__ for name, m in prepared.named_modules() if "activation_post_process" in name}
    # activations by the chosen observer, weights per channel
    assert expected in kinds and "PerChannelMinMaxObserver" in kinds, kinds
    assert not ({"MinMaxObserver", "HistogramObserver"} - {expected}) & kinds, kinds


class _ConvReluAndMore(torch.nn.Module):
    """A conv whose output feeds a relu and a mean: the relu is not the conv's only user."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y) * y.mean(-1, keepdim=True)


def test_a_relu_not_folded_into_the_op_before_it_says_why():
    """Found by the fuzz tests: the relu was left float with no reason (report: 'unexplained')."""
    _, gm = annotate(_ConvReluAndMore(), torch.randn(2, 2, 7))
    relu = next(n for n in gm.graph.nodes if n.target == aten.relu.default)
    assert not is_annotated(relu)
    reason = relu.meta[SKIP_REASON_KEY]
    assert "relu" in reason and f"'{relu.args[0].name}'" in reason and "only user" in reason


def test_every_declared_capability_names_its_ops_and_the_vocabulary_knows_them():
    # the contributed patterns (split, resize) are declared with their ops, as the core ones are
    pm = PluginManager(entry_points=[])
    assert pm.register("onnxruntime", ort_plugin).status == "loaded"
    vocabulary = pm.vocabulary()
    known = vocabulary.all_ops()
    quantizer = ORTQuantizer(activation_dtype="int8", symmetric_activations=True)
    declared = INFO.capabilities + quantizer.quantization_capabilities()
    assert {c.pattern for c in declared} >= set(PATTERNS)
    for cap in declared:
        assert cap.ops, f"{cap.pattern} ({cap.mode}) declares no ops"
        assert cap.ops == vocabulary.ops(cap.pattern), cap.pattern
        assert set(cap.ops) <= known, cap.pattern

"""quantweave-xnnpack without ExecuTorch: pattern semantics, config, transform, declarations.

Every pattern is exercised written functionally and as modules, under default
(non-strict) torch.export; annotations are read after the quantizer's own steps
(``transform_for_annotation`` + ``annotate``), and the quantized models are run through
``prepare_pt2e`` / ``convert_pt2e``.
"""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quantweave as qw
import quantweave_xnnpack as qx
from quantweave.plugin_api import ANNOTATION_KEY, SKIP_REASON_KEY, QuantizerInfo
from quantweave.testing.conformance import capability_cases, check_capability, check_conformance
from quantweave_xnnpack import plugin
from quantweave_xnnpack._capabilities import declared_capabilities
from tests.helpers import assert_names, export

aten = torch.ops.aten
(INFO,) = plugin.quantweave_quantizers()


def quantizer(**options):
    return qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(**options))


def prepare(model, *inputs, q=None, **options):
    """The annotated graph, as prepare_pt2e's quantizer steps leave it (transform, annotate)."""
    q = q if q is not None else quantizer(**options)
    gm = q.transform_for_annotation(export(model, *inputs))
    q.annotate(gm)
    return gm


def flow(model, *inputs, q=None, **options):
    """prepare_pt2e, one calibration pass, convert_pt2e."""
    prepared = qw.prepare_pt2e(export(model, *inputs), q if q is not None else quantizer(**options))
    prepared(*inputs)
    return qw.convert_pt2e(prepared)


def node(gm, target, index=0):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target][index]


def ann(n):
    return n.meta.get(ANNOTATION_KEY)


_WEIGHTED = (aten.conv1d.default, aten.conv2d.default, aten.conv_transpose2d.input, aten.linear.default)


def quantized_inputs(n):
    """{role: spec} of the quantized inputs of ``n``: "input" / "weight" / "bias" for
    conv and linear, the producer's name otherwise."""
    a = ann(n)
    if a is None:
        return {}
    out = {}
    for producer, spec in a.input_qspec_map.items():
        if spec is None:
            continue
        key = producer.name
        if n.target in _WEIGHTED:
            key = {0: "input", 1: "weight", 2: "bias"}[list(n.args).index(producer)]
        out[key] = spec
    return out


def output_spec(n):
    a = ann(n)
    return None if a is None else a.output_qspec


class Fn(nn.Module):
    def __init__(self, fn, **modules):
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)
        self.fn = fn

    def forward(self, *xs):
        return self.fn(self, *xs)


def img(c=3, s=8):
    return torch.randn(1, c, s, s)


# -- plugin and declarations -------------------------------------------------------------------


def test_plugin_declares_api_2_and_is_found_by_name():
    assert plugin.QUANTWEAVE_PLUGIN_API == 2
    q = qw.get_quantizer("xnnpack", is_per_channel=True)
    assert isinstance(q, qx.XNNPACKQuantizer)
    assert q.global_config == qx.get_symmetric_quantization_config(is_per_channel=True)
    modes = {c.mode.value for c in INFO.capabilities}
    assert modes == {"static", "dynamic", "qat"}


def test_discovery_imports_only_declarations():
    code = (
        "import sys, quantweave_xnnpack.plugin as p; p.quantweave_quantizers(); "
        "print('quantweave_xnnpack.quantizer' in sys.modules, 'quantweave_xnnpack._executorch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


@pytest.mark.parametrize("cap", capability_cases(INFO))
def test_declared_capability_conforms(cap):
    assert check_capability(INFO, cap, plugin="xnnpack") == []


def _variant(**config):
    def caps(**mode):
        return declared_capabilities(**config, **mode)

    return QuantizerInfo(
        name="xnnpack",
        factory=plugin.make_quantizer,
        capabilities=caps() + caps(is_dynamic=True) + caps(is_qat=True),
        mode_options={
            "static": dict(config),
            "dynamic": {**config, "is_dynamic": True},
            "qat": {**config, "is_qat": True},
        },
    )


@pytest.mark.slow  # a whole-vocabulary sweep (tox env slow)
@pytest.mark.parametrize(
    "config",
    [{}, {"is_per_channel": True}, {"is_per_channel": True, "weight_qmin": -8, "weight_qmax": 7}],
    ids=["per_tensor", "per_channel", "per_channel_4bit"],
)
def test_conformance_whole_kit_nothing_undeclared(config):
    """Every declared capability in every mode, and no probe of the vocabulary annotates an
    op that no declared capability of that mode covers."""
    assert check_conformance(_variant(**config), plugin="xnnpack") == []


def test_quantizer_declares_what_its_global_config_gives():
    assert quantizer().quantization_capabilities() == declared_capabilities()
    assert quantizer(is_dynamic=True, is_per_channel=True).quantization_capabilities() == declared_capabilities(
        is_dynamic=True, is_per_channel=True
    )
    assert qx.XNNPACKQuantizer().quantization_capabilities() == ()


# -- config ----------------------------------------------------------------------------------------


def test_symmetric_config_defaults_are_executorchs():
    config = qx.get_symmetric_quantization_config()
    act, weight = config.input_activation, config.weight
    assert (act.dtype, act.quant_min, act.quant_max, act.qscheme) == (torch.int8, -128, 127, torch.per_tensor_affine)
    assert act.observer_or_fake_quant_ctr.p.func.__name__ == "HistogramObserver"
    assert act.observer_or_fake_quant_ctr.p.keywords == {"eps": 2**-12}
    assert config.output_activation == act and config.bias is None and not config.is_qat
    assert (weight.dtype, weight.quant_min, weight.quant_max) == (torch.int8, -127, 127)
    assert (weight.qscheme, weight.ch_axis) == (torch.per_tensor_symmetric, 0)
    assert weight.observer_or_fake_quant_ctr.p.func.__name__ == "MinMaxObserver"
    per_channel = qx.get_symmetric_quantization_config(is_per_channel=True).weight
    assert per_channel.qscheme == torch.per_channel_symmetric
    assert per_channel.observer_or_fake_quant_ctr.p.func.__name__ == "PerChannelMinMaxObserver"
    dynamic = qx.get_symmetric_quantization_config(is_dynamic=True)
    assert dynamic.input_activation.is_dynamic and dynamic.output_activation is None
    assert dynamic.input_activation.observer_or_fake_quant_ctr.p.func.__name__ == "PlaceholderObserver"
    qat = qx.get_symmetric_quantization_config(is_qat=True, is_per_channel=True)
    assert qat.is_qat and qat.weight.observer_or_fake_quant_ctr.p.func.__name__ == "FusedMovingAvgObsFakeQuantize"
    assert qat.weight.observer_or_fake_quant_ctr.p.keywords["observer"].__name__ == (
        "MovingAveragePerChannelMinMaxObserver"
    )
    assert qx.get_symmetric_quantization_config() is qx.get_symmetric_quantization_config()  # cached


def test_per_token_dynamic_activations_are_an_option_and_the_default_is_executorchs():
    default = qx.get_symmetric_quantization_config(is_dynamic=True, is_per_channel=True)
    assert default.input_activation.per_token is False  # ExecuTorch's choose_qparams.tensor form
    explicit = qx.get_symmetric_quantization_config(is_dynamic=True, is_per_channel=True, act_granularity="per_tensor")
    assert explicit.input_activation.per_token is False and explicit.input_activation.is_dynamic
    config = qx.get_symmetric_quantization_config(is_dynamic=True, is_per_channel=True, act_granularity="per_token")
    act = config.input_activation
    assert act.per_token and act.is_dynamic and (act.dtype, act.quant_min, act.quant_max) == (torch.int8, -128, 127)
    assert config.output_activation is None
    assert (config.weight.qscheme, config.weight.quant_min) == (torch.per_channel_symmetric, -127)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    exported = export(model, torch.randn(3, 8))
    gm = qw.convert_pt2e(qw.prepare_pt2e(exported, qx.XNNPACKQuantizer().set_global(config)))
    qd = torch.ops.quantized_decomposed
    found = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert found.count(qd.choose_qparams_per_token_asymmetric.default) == 2
    assert qd.choose_qparams.tensor not in found


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"act_granularity": "per_row"}, "act_granularity must be one of per_tensor, per_token; got 'per_row'"),
        ({"act_granularity": "per_token"}, "got is_dynamic=False, is_qat=False"),
        ({"act_granularity": "per_token", "is_dynamic": True, "is_qat": True}, "got is_dynamic=True, is_qat=True"),
        ({"act_granularity": "per_token", "is_dynamic": True, "act_qmin": -127}, "act_qmin=-127, act_qmax=127"),
    ],
    ids=["unknown", "static", "qat", "narrow"],
)
def test_per_token_config_errors_say_what_was_expected(options, message):
    with pytest.raises(ValueError) as info:
        qx.get_symmetric_quantization_config(**options)
    assert_names(info, "get_symmetric_quantization_config", "act_granularity")
    assert message in str(info.value)


def test_config_type_errors_are_clear():
    with pytest.raises(TypeError) as info:
        qx.get_symmetric_quantization_config(is_per_channel=1)
    assert_names(info, "is_per_channel", "bool")
    with pytest.raises(TypeError) as info:
        qx.XNNPACKQuantizer().set_global("int8")
    assert_names(info, "set_global", "QuantizationConfig or None", "got str")
    with pytest.raises(ValueError) as info:
        qx.XNNPACKQuantizer().set_operator_type(aten.softmax.int, qx.get_symmetric_quantization_config())
    assert_names(info, "softmax", "XNNPACK pattern")
    with pytest.raises(TypeError) as info:
        qx.XNNPACKQuantizer().set_operator_type(F.linear, qx.get_symmetric_quantization_config())
    assert_names(info, "set_operator_type", "aten op", "function linear")


def test_without_a_config_nothing_is_annotated():
    gm = prepare(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), img(), q=qx.XNNPACKQuantizer())
    assert not any(quantized_inputs(n) or output_spec(n) for n in gm.graph.nodes)


# -- patterns ------------------------------------------------------------------------------------

CONV_RELU = {
    "module": lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()),
    "functional": lambda: Fn(lambda m, x: F.relu(m.conv(x)), conv=nn.Conv2d(3, 4, 3)),
    "torch.relu": lambda: Fn(lambda m, x: torch.relu(m.conv(x)), conv=nn.Conv2d(3, 4, 3)),
}


@pytest.mark.parametrize("form", sorted(CONV_RELU))
def test_conv_relu_quantizes_conv_inputs_and_relu_output(form):
    gm = prepare(CONV_RELU[form](), img(), is_per_channel=True)
    conv, relu = node(gm, aten.conv2d.default), node(gm, aten.relu.default)
    specs = quantized_inputs(conv)
    assert set(specs) == {"input", "weight"}  # bias stays float
    assert specs["weight"].qscheme == torch.per_channel_symmetric and specs["weight"].ch_axis == 0
    assert output_spec(conv) is None and output_spec(relu) is not None


def test_conv_alone_and_conv1d_quantize_their_output():
    gm = prepare(nn.Conv2d(3, 4, 3), img())
    assert output_spec(node(gm, aten.conv2d.default)) is not None
    gm = prepare(nn.Sequential(nn.Conv1d(3, 4, 3), nn.ReLU()), torch.randn(1, 3, 10))
    assert set(quantized_inputs(node(gm, aten.conv1d.default))) == {"input", "weight"}


def test_conv_transpose_weight_per_channel_on_axis_1_and_groups_must_be_1():
    gm = prepare(nn.Sequential(nn.ConvTranspose2d(4, 6, 3), nn.ReLU()), img(4), is_per_channel=True)
    conv = node(gm, aten.conv_transpose2d.input)
    assert quantized_inputs(conv)["weight"].ch_axis == 1
    assert output_spec(node(gm, aten.relu.default)) is not None
    gm = prepare(nn.ConvTranspose2d(4, 6, 3, groups=2), img(4), is_per_channel=True)
    conv = node(gm, aten.conv_transpose2d.input)
    assert quantized_inputs(conv) == {} and "groups != 1" in conv.meta[SKIP_REASON_KEY]


def test_dynamic_conv_only_4d_non_depthwise_weights_and_no_outputs():
    model = Fn(
        lambda m, x, s: (m.conv(x), m.dw(x), m.c1(s)),
        conv=nn.Conv2d(4, 8, 3),
        dw=nn.Conv2d(4, 4, 3, groups=4),
        c1=nn.Conv1d(4, 8, 3),
    )
    gm = prepare(model, img(4), torch.randn(1, 4, 10), is_dynamic=True)
    conv, dw = node(gm, aten.conv2d.default, 0), node(gm, aten.conv2d.default, 1)
    c1 = node(gm, aten.conv1d.default)
    assert quantized_inputs(conv)["input"].is_dynamic and output_spec(conv) is None
    assert quantized_inputs(dw) == {} and "depthwise" in dw.meta[SKIP_REASON_KEY]
    assert quantized_inputs(c1) == {} and "4-D" in c1.meta[SKIP_REASON_KEY]


def test_dynamic_config_annotates_only_linear_and_conv():
    model = Fn(lambda m, x, y: m.fc(x) + y, fc=nn.Linear(8, 8))
    gm = prepare(model, torch.randn(2, 8), torch.randn(2, 8), is_dynamic=True)
    linear = node(gm, aten.linear.default)
    assert quantized_inputs(linear)["input"].is_dynamic and output_spec(linear) is None
    assert ann(node(gm, aten.add.Tensor)) is None


@pytest.mark.parametrize("form", ["module", "functional"])
def test_linear_relu_and_linear(form):
    if form == "module":
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    else:
        model = Fn(lambda m, x: m.b(F.relu(m.a(x))), a=nn.Linear(8, 8), b=nn.Linear(8, 4))
    gm = prepare(model, torch.randn(2, 8))
    first, second = node(gm, aten.linear.default, 0), node(gm, aten.linear.default, 1)
    assert output_spec(first) is None and output_spec(node(gm, aten.relu.default)) is not None
    assert output_spec(second) is not None and set(quantized_inputs(second)) == {"input", "weight"}


ADDS = {
    "operator": lambda m, x, y: x + y,
    "torch.add": lambda m, x, y: torch.add(x, y),
}


@pytest.mark.parametrize("form", sorted(ADDS))
def test_standalone_add_functional_forms(form):
    """ExecuTorch finds no standalone add written either way under non-strict export (anchor);
    matched on aten.add.Tensor, both forms are annotated."""
    gm = prepare(Fn(ADDS[form]), torch.randn(2, 8), torch.randn(2, 8))
    add = node(gm, aten.add.Tensor)
    assert set(quantized_inputs(add)) == {"xs_0", "xs_1"} and output_spec(add) is not None


@pytest.mark.parametrize("op", ["add", "mul"])
def test_binary_relu_quantizes_inputs_and_relu_output(op):
    fn = (lambda m, x, y: F.relu(x + y)) if op == "add" else (lambda m, x, y: F.relu(x * y))
    gm = prepare(Fn(fn), torch.randn(2, 8), torch.randn(2, 8))
    binary = node(gm, aten.add.Tensor if op == "add" else aten.mul.Tensor)
    assert set(quantized_inputs(binary)) == {"xs_0", "xs_1"} and output_spec(binary) is None
    assert output_spec(node(gm, aten.relu.default)) is not None


def test_scalar_operand_becomes_a_buffer_without_touching_the_callers_model():
    exported = export(Fn(lambda m, x: x * 0.5 + 1), torch.randn(2, 8))
    before_code, before_buffers = exported.code, dict(exported.named_buffers())
    q = quantizer()
    transformed = q.transform_for_annotation(exported)
    assert transformed is not exported
    assert exported.code == before_code and dict(exported.named_buffers()) == before_buffers
    constants = {n.target: n for n in transformed.graph.nodes if n.op == "get_attr"}
    assert sorted(float(getattr(transformed, t)) for t in constants) == [0.5, 1.0]
    prepared = qw.prepare_pt2e(exported, q)
    mul, add = node(prepared, aten.mul.Tensor), node(prepared, aten.add.Tensor)
    assert len(quantized_inputs(mul)) == 2 and len(quantized_inputs(add)) == 2
    assert exported.code == before_code and dict(exported.named_buffers()) == before_buffers
    x = torch.randn(2, 8)
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    assert torch.allclose(converted(x), x * 0.5 + 1, atol=0.05)
    assert q.transform_for_annotation(export(nn.Linear(2, 2), torch.randn(1, 2))) is not None


def test_scalar_buffer_records_a_fake_value_of_the_graphs_fake_mode():
    """The new constant's meta["val"] is what torch.export records for a 0-d float32 buffer:
    a FakeTensor of the graph's own fake mode, with the buffer's shape, strides, dtype and device."""
    from torch._subclasses.fake_tensor import FakeTensor

    exported = export(Fn(lambda m, x: x * 0.5 + 1), torch.randn(2, 8))
    transformed = quantizer().transform_for_annotation(exported)
    mode = next(n.meta["val"].fake_mode for n in transformed.graph.nodes if n.op == "placeholder")
    constants = [n for n in transformed.graph.nodes if n.op == "get_attr"]
    assert len(constants) == 2
    for constant in constants:
        val, real = constant.meta["val"], getattr(transformed, constant.target)
        assert isinstance(val, FakeTensor) and val.fake_mode is mode
        assert (val.shape, val.stride(), val.dtype, val.device) == (real.shape, real.stride(), real.dtype, real.device)
        assert val.shape == () and val.dtype == torch.float32
    assert constants[0].meta["val"] is not constants[1].meta["val"]


def test_scalar_of_an_integer_add_is_left_alone():
    """An int tensor + 1 keeps its dtype: no float buffer is introduced (ExecuTorch would
    turn 1 into a float32 0-d tensor, promoting the result to float)."""
    exported = export(Fn(lambda m, x, i: x + (i + 1).float()), torch.randn(4), torch.arange(4))
    transformed = quantizer().transform_for_annotation(exported)
    int_add = [n for n in transformed.graph.nodes if n.target == aten.add.Tensor and n.args[1] == 1]
    assert len(int_add) == 1


def test_non_float_and_huge_scalar_operands_leave_add_and_mul_float():
    exported = export(Fn(lambda m, x, i: (x * 1e16, i + i)), torch.randn(4), torch.arange(4))
    gm = qw.prepare_pt2e(exported, quantizer())
    mul, add = node(gm, aten.mul.Tensor), node(gm, aten.add.Tensor)
    assert quantized_inputs(mul) == {} and "3.4e15" in mul.meta[SKIP_REASON_KEY]
    assert quantized_inputs(add) == {} and "float32" in add.meta[SKIP_REASON_KEY]


def test_cat_shares_qparams_with_its_first_annotated_producer():
    model = Fn(lambda m, x: torch.cat([torch.sigmoid(x), m.conv(x)], 1), conv=nn.Conv2d(3, 3, 1))
    gm = prepare(model, img())
    cat, conv = node(gm, aten.cat.default), node(gm, aten.conv2d.default)
    specs = quantized_inputs(cat)
    assert isinstance(specs["conv2d"], qw.QuantizationSpec)  # the annotated producer owns the observer
    assert specs["sigmoid"] == qw.SharedQuantizationSpec((conv, cat))
    assert output_spec(cat) == qw.SharedQuantizationSpec((conv, cat))
    assert flow(model, img())(img()).shape == (1, 6, 8, 8)


POOLS = {
    "module": lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1)),
    "functional": lambda: Fn(lambda m, x: F.adaptive_avg_pool2d(m.conv(x), 1), conv=nn.Conv2d(3, 4, 3)),
}


@pytest.mark.parametrize("form", sorted(POOLS))
def test_adaptive_avg_pool2d_shares_its_input_qparams(form):
    gm = prepare(POOLS[form](), img())
    pool, conv = node(gm, aten.adaptive_avg_pool2d.default), node(gm, aten.conv2d.default)
    assert quantized_inputs(pool)["conv2d"] == qw.SharedQuantizationSpec(conv)
    assert output_spec(pool) == qw.SharedQuantizationSpec((conv, pool))


def test_adaptive_avg_pool2d_of_a_float_producer_is_quantized_on_its_own():
    gm = prepare(Fn(lambda m, x: F.adaptive_avg_pool2d(torch.sigmoid(x), 1)), img())
    pool = node(gm, aten.adaptive_avg_pool2d.default)
    assert isinstance(quantized_inputs(pool)["sigmoid"], qw.QuantizationSpec)


def test_shared_qparams_propagate_through_shape_and_pooling_ops():
    def forward(m, x):
        y = F.hardtanh(m.conv(x), 0.0, 6.0)
        y = m.drop(F.max_pool2d(y, 2))
        y = y.permute(0, 2, 3, 1).transpose(1, 2)[:, :2]
        y = y.reshape(1, -1).view(1, 1, -1).squeeze(1).mean(dim=1, keepdim=True)
        return torch.flatten(y, 0)

    gm = prepare(Fn(forward, conv=nn.Conv2d(3, 8, 3), drop=nn.Dropout(0.1)), img())
    ops = [
        aten.hardtanh.default,
        aten.max_pool2d.default,
        aten.dropout.default,
        aten.permute.default,
        aten.transpose.int,
        aten.slice.Tensor,
        aten.reshape.default,
        aten.view.default,
        aten.squeeze.dim,
        aten.mean.dim,
        aten.flatten.using_ints,
    ]
    for op in ops:
        n = node(gm, op)
        producer = n.args[0]
        assert quantized_inputs(n) == {producer.name: qw.SharedQuantizationSpec(producer)}, op
        assert output_spec(n) == qw.SharedQuantizationSpec(producer), op


def test_relu6_shares_the_conv_output_qparams():
    """Intended difference: F.relu6 exports to aten.relu6 (not hardtanh) under torch.export;
    ExecuTorch leaves it float, we share qparams through it like hardtanh."""
    gm = prepare(Fn(lambda m, x: F.relu6(m.conv(x)), conv=nn.Conv2d(3, 4, 3)), img())
    conv, relu6 = node(gm, aten.conv2d.default), node(gm, aten.relu6.default)
    assert output_spec(relu6) == qw.SharedQuantizationSpec(conv)


def test_qat_conv_bn_relu_is_one_pattern_and_folds():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    x = torch.randn(2, 3, 8, 8)
    prepared = qw.prepare_qat_pt2e(torch.export.export(model, (x,)).module(), quantizer(is_qat=True))
    relu = node(prepared, aten.relu.default)
    assert output_spec(relu) is not None
    prepared(x)
    converted = qw.convert_pt2e(qw.move_exported_model_to_eval(prepared))
    assert not any(n.target == aten.batch_norm.default for n in converted.graph.nodes)


def test_qat_per_channel_conv_transpose_weight_uses_axis_1_and_runs():
    model = nn.Sequential(nn.ConvTranspose2d(4, 6, 3), nn.ReLU()).train()
    x = torch.randn(2, 4, 6, 6)
    prepared = qw.prepare_qat_pt2e(
        torch.export.export(model, (x,)).module(), quantizer(is_qat=True, is_per_channel=True)
    )
    specs = ann(node(prepared, aten.conv_transpose2d.input)).input_qspec_map.values()
    assert [s.ch_axis for s in specs if s is not None and s.qscheme == torch.per_channel_symmetric] == [1]
    prepared(x)
    converted = qw.convert_pt2e(qw.move_exported_model_to_eval(prepared))
    dq = [n for n in converted.graph.nodes if "dequantize_per_channel" in str(n.target)]
    assert dq and dq[0].args[3] == 1  # axis
    assert converted(x).shape == model(x).shape


# -- configuration precedence and filters --------------------------------------------------------


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.b = nn.Sequential(nn.Linear(8, 8))
        self.c = nn.Conv2d(3, 3, 1)

    def forward(self, x, img):
        return self.b(self.a(x)) + 1.0, self.c(img)


def _inputs():
    return torch.randn(2, 8), img()


def test_module_name_beats_module_type_beats_operator_type_beats_global():
    dynamic = qx.get_symmetric_quantization_config(is_dynamic=True)
    per_channel = qx.get_symmetric_quantization_config(is_per_channel=True)
    four_bit = qx.get_symmetric_quantization_config(weight_qmin=-8, weight_qmax=7)
    q = (
        qx.XNNPACKQuantizer()
        .set_global(qx.get_symmetric_quantization_config())
        .set_operator_type(aten.linear.default, four_bit)
        .set_module_type(nn.Sequential, per_channel)
        .set_module_name("b", dynamic)
    )
    gm = prepare(Two(), *_inputs(), q=q)
    a_linear, b_linear = node(gm, aten.linear.default, 0), node(gm, aten.linear.default, 1)
    assert quantized_inputs(b_linear)["input"].is_dynamic  # module name
    assert quantized_inputs(a_linear)["weight"].qscheme == torch.per_channel_symmetric  # module type
    conv = node(gm, aten.conv2d.default)
    assert quantized_inputs(conv)["weight"].quant_max == 127  # global: conv is not a linear
    q = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config())
    q.set_operator_type(aten.linear.default, four_bit)
    gm = prepare(Two(), *_inputs(), q=q)
    assert quantized_inputs(node(gm, aten.linear.default, 1))["weight"].quant_max == 7  # operator type
    assert quantized_inputs(node(gm, aten.conv2d.default))["weight"].quant_max == 127


def test_module_name_config_covers_conv_weights():
    """Intended difference: ExecuTorch applies module filters to the weight get_attr nodes
    too (which carry no module stack), so set_module_name / set_module_type never match a
    conv; we filter on the pattern's compute nodes."""
    q = qx.XNNPACKQuantizer().set_module_name("c", qx.get_symmetric_quantization_config())
    gm = prepare(Two(), *_inputs(), q=q)
    assert set(quantized_inputs(node(gm, aten.conv2d.default))) == {"input", "weight"}
    assert quantized_inputs(node(gm, aten.linear.default)) == {}


def test_none_config_leaves_the_module_float_and_says_why():
    q = quantizer().set_module_name("a", None)
    gm = prepare(Two(), *_inputs(), q=q)
    a_linear = node(gm, aten.linear.default, 0)
    assert quantized_inputs(a_linear) == {} and "module name 'a' is configured None" in a_linear.meta[SKIP_REASON_KEY]
    assert quantized_inputs(node(gm, aten.linear.default, 1)) != {}
    q = quantizer().set_operator_type(aten.conv2d.default, None)
    gm = prepare(Two(), *_inputs(), q=q)
    assert quantized_inputs(node(gm, aten.conv2d.default)) == {}


def test_filter_function_applies_to_every_config_and_to_sharing():
    q = quantizer().set_filter_function(lambda n: n.name != "linear_1" and n.name != "relu")
    gm = prepare(Two(), *_inputs(), q=q)
    assert quantized_inputs(node(gm, aten.linear.default, 1)) == {}
    first = node(gm, aten.linear.default, 0)
    assert quantized_inputs(first) != {} and output_spec(first) is not None  # linear alone, relu refused
    assert ann(node(gm, aten.relu.default)) is None or output_spec(node(gm, aten.relu.default)) is None
    assert quantized_inputs(node(gm, aten.conv2d.default)) != {}


def _attr(module, target):
    for part in target.split("."):
        module = getattr(module, part)
    return module


# -- 4-bit weights ---------------------------------------------------------------------------------


@pytest.mark.parametrize("per_channel", [False, True])
def test_4bit_weights_are_in_minus_8_to_7(per_channel):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4)).eval()
    x = img()
    converted = flow(model, x, is_per_channel=per_channel, weight_qmin=-8, weight_qmax=7)
    constants = [_attr(converted, n.target) for n in converted.graph.nodes if n.op == "get_attr"]
    int8 = [w for w in constants if w.dtype == torch.int8]
    assert len(int8) == 2
    for w in int8:
        assert int(w.min()) >= -8 and int(w.max()) <= 7
        assert int(w.min()) == -8 or int(w.max()) == 7  # the range is used, not just allowed
    dq = [n for n in converted.graph.nodes if "dequantize" in str(n.target) and n.args[0].op == "get_attr"]
    assert {(n.args[-3], n.args[-2]) for n in dq} == {(-8, 7)}


# -- to_executorch without ExecuTorch -------------------------------------------------------------


def test_to_executorch_says_what_to_install_when_executorch_is_missing(monkeypatch):
    for name in ("executorch", "executorch.exir", "executorch.backends.xnnpack.partition.xnnpack_partitioner"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(qx.ExecuTorchNotInstalledError) as info:
        qx.to_executorch(nn.Linear(2, 2), (torch.randn(1, 2),))
    assert_names(info, "torchao==0.18.0", "executorch", "--no-deps")
    assert issubclass(qx.ExecuTorchNotInstalledError, ImportError)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("builder", ["mobilenet_v2_like", "encoder_block", "resnet18_like", "conv_transpose_decoder"])
def test_every_float_node_of_a_declared_op_says_why(builder, dynamic):
    from quantweave.testing import models

    model = getattr(models, builder)()
    config = qx.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    quantizer = qx.XNNPACKQuantizer().set_global(config)
    prepared = qw.prepare_pt2e(torch.export.export(model.eval(), models.example_inputs(model)).module(), quantizer)
    report = qw.annotation_report(prepared, quantizer)
    assert report.quantized > 0
    assert [(n.node, n.op) for n in report.nodes if n.kind == "unexplained"] == []


def _per_token_info(declared: str) -> QuantizerInfo:
    """Dynamic quantizer configured per token, declaring activations ``declared``."""
    return QuantizerInfo(
        name="xnnpack",
        factory=plugin.make_quantizer,
        capabilities=declared_capabilities(is_per_channel=True, is_dynamic=True, act_granularity=declared),
        mode_options={"dynamic": {"is_per_channel": True, "is_dynamic": True, "act_granularity": "per_token"}},
    )


def test_per_token_dynamic_conforms_and_declares_per_token():
    q = quantizer(is_dynamic=True, is_per_channel=True, act_granularity="per_token")
    caps = q.quantization_capabilities()
    assert caps == declared_capabilities(is_per_channel=True, is_dynamic=True, act_granularity="per_token")
    assert {c.activation.granularity for c in caps} == {"per_token"}
    assert "int8[-128,127] per_token affine" in {str(c.activation) for c in caps}
    # the kit checks the annotation (per_token) and the converted graph (dequantize_per_token
    # of a quantize_per_token whose scale choose_qparams_per_token_asymmetric chose)
    assert check_conformance(_per_token_info("per_token"), plugin="xnnpack") == []


def test_kit_rejects_a_per_token_quantizer_declared_per_tensor():
    failures = check_conformance(_per_token_info("per_tensor"), plugin="xnnpack")
    assert failures
    assert any("declared int8[-128,127] per_tensor affine" in str(f) and "per_token" in str(f) for f in failures), [
        str(f) for f in failures
    ]

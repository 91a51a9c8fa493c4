"""What LiteRTQuantizer does to a graph, checked on the converted model (no litert-torch
needed): fixed qparams, shared qparams without requantization, float where it does not
apply (with the reason), dynamic-range weights, and what to_tflite refuses up front."""

import importlib.util
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from quantweave_litert import LiteRTQuantizer, to_tflite
from quantweave_litert.tflite import conversion_mode, quantize

import quantweave as qw
from quantweave.plugin_api import SKIP_REASON_KEY, is_annotated

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


class _M(torch.nn.Module):
    def __init__(self, forward, **modules):
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)
        self._forward = forward

    def forward(self, *xs):
        return self._forward(self, *xs)


def converted(model, *inputs, quantizer=None):
    return quantize(model.eval(), inputs, quantizer or LiteRTQuantizer(), [inputs, tuple(2 * x for x in inputs)])


def quantize_after(gm, target):
    """The quantize node right after the (first) node calling ``target``."""
    node = next(n for n in gm.graph.nodes if n.target == target)
    return next(u for u in node.users if u.target == qd.quantize_per_tensor.default)


def dequantize_into(gm, target):
    node = next(n for n in gm.graph.nodes if n.target == target)
    return [a for a in node.all_input_nodes if a.target == qd.dequantize_per_tensor.default]


@pytest.mark.parametrize("op", [torch.sigmoid, lambda t: torch.softmax(t, -1)], ids=["sigmoid", "softmax"])
def test_sigmoid_and_softmax_outputs_have_litert_fixed_qparams(op):
    model = _M(lambda m, x: op(m.fc(x)), fc=torch.nn.Linear(8, 8))
    gm = converted(model, torch.randn(4, 8))
    target = aten.sigmoid.default if op is torch.sigmoid else aten.softmax.int
    q = quantize_after(gm, target)
    assert q.args[1:] == (1 / 256, -128, -128, 127, torch.int8)


def test_ops_that_keep_their_input_qparams_need_no_requantization():
    def forward(m, x):
        a = F.relu(m.conv(x))
        return m.fc(F.adaptive_avg_pool2d(F.max_pool2d(a, 2), 1).flatten(1))

    model = _M(forward, conv=torch.nn.Conv2d(3, 8, 3), fc=torch.nn.Linear(8, 4))
    gm = converted(model, torch.randn(1, 3, 12, 12))
    relu_q = quantize_after(gm, aten.relu.default)
    activation_qs = [n for n in gm.graph.nodes if n.target == qd.quantize_per_tensor.default]
    # each op's output is quantized (6 quantize nodes), with 3 sets of qparams: the input,
    # relu (kept by max_pool2d, adaptive_avg_pool2d, flatten and the linear's input), linear
    assert len(activation_qs) == 6
    assert len({q.args[1:] for q in activation_qs}) == 3
    (into_fc,) = dequantize_into(gm, aten.linear.default)
    assert into_fc.args[1:] == relu_q.args[1:]


def test_cat_inputs_and_output_share_one_set_of_qparams():
    model = _M(lambda m, x: torch.cat([m.a(x), m.b(x)], 1), a=torch.nn.Conv2d(3, 4, 3), b=torch.nn.Conv2d(3, 4, 3))
    gm = converted(model, torch.randn(1, 3, 8, 8))
    into_cat = dequantize_into(gm, aten.cat.default)
    out = quantize_after(gm, aten.cat.default)
    assert len(into_cat) == 2
    assert {dq.args[1:] for dq in into_cat} == {out.args[1:]}


def test_conv_relu_runs_as_one_unit():
    model = _M(lambda m, x: F.relu(m.conv(x)), conv=torch.nn.Conv2d(3, 8, 3))
    gm = converted(model, torch.randn(1, 3, 8, 8))
    relu = next(n for n in gm.graph.nodes if n.target == aten.relu.default)
    assert relu.args[0].target == aten.conv2d.default  # nothing quantized in between


def test_an_op_that_shares_qparams_stays_float_after_an_unquantized_producer():
    model = _M(lambda m, x: m.conv(F.max_pool2d(x, 2)), conv=torch.nn.Conv2d(3, 8, 3))
    exported = torch.export.export(model.eval(), (torch.randn(1, 3, 12, 12),)).module()
    prepared = qw.prepare_pt2e(exported, LiteRTQuantizer())
    pool = next(n for n in prepared.graph.nodes if n.target == aten.max_pool2d.default)
    assert not is_annotated(pool)
    assert "not quantized by litert" in pool.meta[SKIP_REASON_KEY]


def test_add_with_a_scalar_operand_stays_float_and_says_why():
    model = _M(lambda m, x: m.fc(x) + 1.0, fc=torch.nn.Linear(8, 8))
    exported = torch.export.export(model.eval(), (torch.randn(2, 8),)).module()
    prepared = qw.prepare_pt2e(exported, LiteRTQuantizer())
    add = next(n for n in prepared.graph.nodes if n.target == aten.add.Tensor)
    assert not is_annotated(add)
    assert "both operands are float32 tensors" in add.meta[SKIP_REASON_KEY]


def test_a_relu_not_fused_into_the_op_before_it_stays_float_and_says_why():
    """litert quantizes relu only as the fused activation of conv2d / linear / add (found by the
    fuzz tests: a relu after a chunk was left float with no reason)."""

    def forward(m, x):
        a, b = x.chunk(2, dim=-1)
        return torch.relu(a) + b

    exported = torch.export.export(_M(forward).eval(), (torch.randn(2, 8),)).module()
    prepared = qw.prepare_pt2e(exported, LiteRTQuantizer())
    relu = next(n for n in prepared.graph.nodes if n.target == aten.relu.default)
    assert not is_annotated(relu)
    reason = relu.meta[SKIP_REASON_KEY]
    assert "relu" in reason and "conv2d_relu" in reason and f"'{relu.args[0].name}'" in reason


def test_dynamic_range_mode_quantizes_only_linear_weights():
    model = _M(lambda m, x: m.fc2(F.relu(m.fc1(x))), fc1=torch.nn.Linear(8, 16), fc2=torch.nn.Linear(16, 4))
    gm = converted(model, torch.randn(2, 8), quantizer=LiteRTQuantizer(is_dynamic=True))
    targets = [n.target for n in gm.graph.nodes]
    assert targets.count(qd.quantize_per_channel.default) == 2
    assert qd.quantize_per_tensor.default not in targets
    assert conversion_mode(gm) is True


def test_conversion_mode_reads_the_model_and_rejects_folded_weights():
    model = _M(lambda m, x: F.relu(m.fc(x)), fc=torch.nn.Linear(8, 8)).eval()
    x = torch.randn(2, 8)
    assert conversion_mode(converted(model, x)) is False
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), LiteRTQuantizer())
    prepared(x)
    with pytest.raises(ValueError, match=r"folded weights.*fold_quantize=False"):
        conversion_mode(qw.convert_pt2e(prepared))
    with pytest.raises(ValueError) as info:
        conversion_mode(torch.export.export(model, (x,)).module())
    # what was called, what the model lacks, the two fixes
    names = ("to_tflite", "no quantize ops", "quantizer=LiteRTQuantizer()", "fold_quantize=False")
    assert all(name in str(info.value) for name in names), (names, info.value)
    with pytest.raises(TypeError) as info:
        to_tflite(model, (x,))
    names = ("to_tflite", "_M", "no quantizer", "quantizer=LiteRTQuantizer()")  # what it got, what it lacks, the fix
    assert all(name in str(info.value) for name in names), (names, info.value)


@pytest.mark.skipif(importlib.util.find_spec("litert_torch") is not None, reason="litert-torch is installed")
def test_to_tflite_without_litert_torch_names_the_extra():
    model = _M(lambda m, x: m.fc(x), fc=torch.nn.Linear(8, 8))
    with pytest.raises(ImportError, match=r"quantweave-litert\[litert\]"):
        to_tflite(model.eval(), (torch.randn(2, 8),), quantizer=LiteRTQuantizer())


def test_importing_the_plugin_does_not_import_litert_torch():
    code = "import sys, quantweave_litert, quantweave_litert.plugin; print('litert_torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_is_dynamic_must_be_a_bool():
    with pytest.raises(TypeError) as info:
        LiteRTQuantizer(is_dynamic="yes")
    names = ("LiteRTQuantizer", "is_dynamic", "bool", "'yes'")  # the class, the option, what it takes, what it got
    assert all(name in str(info.value) for name in names), (names, info.value)

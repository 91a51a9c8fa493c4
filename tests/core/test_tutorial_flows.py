"""The PT2E tutorial quantizers run on quantweave with only import paths changed."""

import pytest
import torch

import quantweave as qw
from quantweave.convert import DEQUANTIZE_OPS, QUANTIZE_OPS
from quantweave.observers import FixedQParamsObserver, ObserverBase
from quantweave.testing.inspect import count_ops, qdq_summary, sqnr
from quantweave.testing.reference import quantweave_api
from tests.helpers import export
from tests.tutorial import FLOWS, build

QW = build(quantweave_api())
qd = torch.ops.quantized_decomposed


def run_flow(name):
    model_cls, make_inputs, quantizer_name = FLOWS[name]
    torch.manual_seed(0)
    model = model_cls().eval()
    inputs = make_inputs()
    prepared = qw.prepare_pt2e(export(model, *inputs), getattr(QW, quantizer_name)())
    for _ in range(3):
        prepared(*make_inputs())
    prepared(*inputs)
    return model, inputs, prepared, qw.convert_pt2e(prepared)


def observers_of(prepared):
    return {id(m): m for m in prepared.modules() if isinstance(m, ObserverBase)}


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_tutorial_flow_quantizes_and_stays_close_to_float(name):
    model, inputs, _prepared, converted = run_flow(name)
    assert count_ops(converted, DEQUANTIZE_OPS) > 0
    assert sqnr(model(*inputs), converted(*inputs)) > 25


def test_backend_quantizer_annotates_conv_linear_and_maxpool():
    _, _, _, converted = run_flow("backend_conv_linear_maxpool")
    summary = qdq_summary(converted)
    # conv, linear: activation and weight quantized; max_pool2d input quantized
    assert {k[0] for k in summary} >= {"conv2d", "linear", "max_pool2d"}
    weights = [v for (user, src), v in summary.items() if src == "<constant arg 1>"]
    assert len(weights) == 2 and all(v[-1] == torch.int8 and v[-3:-1] == (-127, 127) for v in weights)
    # max_pool2d output shares its input's qparams: the dq feeding flatten equals the pool input's
    pool_in = summary[("max_pool2d", "conv2d")]
    assert summary[("flatten", "max_pool2d")][:2] == pool_in[:2]


def test_add_inputs_and_output_share_one_observer():
    _, _, prepared, converted = run_flow("add_shared")
    assert len(observers_of(prepared)) == 1
    summary = qdq_summary(converted)
    assert summary[("add", "x")] == summary[("add", "y")] == summary[("output", "add")]


def test_sigmoid_output_uses_fixed_qparams():
    _, _, prepared, converted = run_flow("sigmoid_fixed")
    assert any(isinstance(m, FixedQParamsObserver) for m in prepared.modules())
    scale, zero_point, qmin, qmax, dtype = qdq_summary(converted)[("output", "sigmoid")]
    assert (scale, zero_point, qmin, qmax, dtype) == (1 / 256, 0, 0, 255, torch.uint8)


def test_conv_bias_is_int32_with_derived_scale():
    _, _, _prepared, converted = run_flow("conv_derived_bias")
    summary = qdq_summary(converted)
    act_scale = summary[("conv2d", "x")][0]
    weight = summary[("conv2d", "<constant arg 1>")]
    bias = summary[("conv2d", "<constant arg 2>")]
    assert weight[-1] == torch.int8
    assert bias[0] == pytest.approx(act_scale * weight[0], rel=1e-6)
    assert bias[2:] == (-(2**31), 2**31 - 1, torch.int32)
    folded = [b for name, b in converted.named_buffers() if b.dtype == torch.int32]
    assert len(folded) == 1, "the int32 bias is stored quantized"


def test_cat_inputs_share_transitively_one_observer_instance():
    _, _, prepared, converted = run_flow("cat_shared")
    conv_outputs = [n for n in prepared.graph.nodes if n.op == "call_module" and n.args[0].name.startswith("conv2d")]
    modules = {id(prepared.get_submodule(n.target)) for n in conv_outputs}
    assert len(modules) == 1, "both conv outputs, both cat inputs and the cat output share one observer"
    summary = qdq_summary(converted)
    assert summary[("cat", "conv2d")] == summary[("cat", "conv2d_1")] == summary[("output", "cat")]


def test_quantized_ops_are_the_decomposed_reference_ops():
    _, _, _, converted = run_flow("backend_conv_linear_maxpool")
    targets = {n.target for n in converted.graph.nodes if n.op == "call_function"}
    assert qd.quantize_per_tensor.default in targets
    assert qd.dequantize_per_channel.default in targets
    assert not any(n.op == "call_module" and "activation_post_process" in str(n.target) for n in converted.graph.nodes)
    assert count_ops(converted, QUANTIZE_OPS) == count_ops(converted, (qd.quantize_per_tensor.default,))

"""A real client: quantweave-xnnpack's output lowered by ExecuTorch's XNNPACK partitioner
and run on the ExecuTorch runtime (tox env ``xnnpack``; ExecuTorch 1.5.1).

For each model x config: every quantized compute node is inside an XNNPACK delegate (no
quantize/dequantize, conv, linear, add, mul, cat, pooling or shape op left to ExecuTorch's
portable kernels), and the runtime's output matches the converted (reference q/dq) model
within one quantization step of the output after post-training quantization. Measured
exceptions, asserted as such: after QAT the MobileNet-like model's output may be up to two
steps off (measured on its five-block form: 6 of 20 elements, one-step rounding flips in its
17 requantizing layers add up; the tests now use a two-block form, _cases.MODELS, under the
same bound); dynamic models have a float output (XNNPACK quantizes each row of an activation at
run time, the reference the whole tensor), so there the bound is a signal-to-noise ratio.
The QAT conv_transpose decoder's batch norms are folded at convert, as for convs.
"""

import pytest
import torch

import quantweave_xnnpack as qx
from quantweave.testing.inspect import sqnr

from ._cases import CONFIGS, MODELS, example_inputs, ours, output_step, run_flow

pytestmark = pytest.mark.executorch
pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e xnnpack)")

#: ops that may stay outside the delegate: float ops XNNPACK 1.5.1 does not take
#: (the transformer block's layer norm, its qkv split and the expand of its matmuls)
FLOAT_LEFTOVERS = {"aten.native_layer_norm.default", "aten.split_with_sizes_copy.default", "aten.expand_copy.default"}


@pytest.fixture(scope="module")
def lowered():
    cache = {}

    def get(model_name, config_name):
        key = (model_name, config_name)
        if key not in cache:
            converted, inputs = ours(model_name, config_name)
            cache[key] = qx.to_executorch(converted, inputs)
        return cache[key]

    return get


CASES = [(m, c) for m in MODELS for c in CONFIGS]


@pytest.mark.parametrize(("model_name", "config_name"), CASES)
def test_every_quantized_node_is_delegated(model_name, config_name, lowered):
    program = lowered(model_name, config_name)
    assert program.delegate_count >= 1
    assert any("quantize_per" in op for op in program.delegated), program.summary()
    left = set(program.not_delegated)
    assert not any("quantize" in op or "choose_qparams" in op for op in left), program.summary()
    assert left <= FLOAT_LEFTOVERS, program.summary()


@pytest.mark.parametrize(("model_name", "config_name"), CASES)
def test_runtime_output_matches_the_converted_model(model_name, config_name, lowered):
    converted, inputs = ours(model_name, config_name)
    runner = lowered(model_name, config_name).load()
    (out,) = runner(*inputs)
    ref = converted(*inputs)
    assert out.shape == ref.shape
    step = output_step(converted)
    if CONFIGS[config_name].get("is_dynamic"):
        assert step is None
        assert sqnr(ref, out) > 30, f"SQNR {sqnr(ref, out):.1f} dB"
    else:
        assert step is not None
        steps = (out - ref).abs() / step
        allowed = 2 if (model_name, config_name) == ("mobilenet_v2", "qat") else 1
        assert steps.max().item() <= allowed + 1e-3, f"{steps.max().item():.3f} quantization steps apart"


def test_program_runs_repeatedly_and_saves(lowered, tmp_path):
    _, inputs = ours("mobilenet_v2", "static_per_channel")
    program = lowered("mobilenet_v2", "static_per_channel")
    runner = program.load()
    first = runner(*inputs)[0]
    assert torch.equal(runner(*inputs)[0], first)
    program.save(str(tmp_path / "model.pte"))
    assert (tmp_path / "model.pte").read_bytes() == program.buffer
    assert "delegated" in program.summary()


def _lower_4bit(model, config, linear_config=None):
    import quantweave as qw
    from quantweave.testing import models

    inputs = models.example_inputs(model)
    quantizer = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(**config))
    if linear_config is not None:
        quantizer.set_operator_type(
            torch.ops.aten.linear.default, qx.get_symmetric_quantization_config(**linear_config)
        )
    prepared = qw.prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
    for batch in models.calibration_batches(model, 3):
        prepared(*batch)
    converted = qw.convert_pt2e(prepared)
    return converted, inputs


FOUR_BIT = {"weight_qmin": -8, "weight_qmax": 7}


def _conv_head():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, 2, 1),
        torch.nn.Hardtanh(0, 6),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    ).eval()


def test_4bit_per_channel_linear_weights_are_packed_and_run(lowered):
    """What ExecuTorch 1.5.1 does with weight_qmin=-8, weight_qmax=7: per-channel 4-bit
    linear weights are taken as XNNPACK 4-bit weights (packed two per byte: the program
    shrinks) and run; the output stays within two steps of the reference (one element of
    1024 measured two steps off). The int8 program is the shared static per-channel
    transformer block's (the same model, config, inputs and calibration)."""
    from quantweave.testing import models

    sizes = {}
    for name, config in (("int8", {"is_per_channel": True}), ("int4", {"is_per_channel": True, **FOUR_BIT})):
        if name == "int8":
            converted, inputs = ours("transformer_block", "static_per_channel")
            program = lowered("transformer_block", "static_per_channel")
        else:
            converted, inputs = _lower_4bit(models.encoder_block(), config)
            program = qx.to_executorch(converted, inputs)
        assert not any("quantize" in op for op in program.not_delegated), program.summary()
        (out,) = program.load()(*inputs)
        steps = (out - converted(*inputs)).abs() / output_step(converted)
        assert steps.max().item() <= 2.001 and (steps > 1.001).float().mean().item() < 0.01
        sizes[name] = len(program.buffer)
    assert sizes["int4"] < 0.75 * sizes["int8"], sizes


def test_4bit_per_channel_conv_weights_do_not_lower_in_executorch_1_5_1():
    """ExecuTorch 1.5.1's XNNPACK partitioner takes any per-channel [-8, 7] weight for a
    4-bit weight and packs only 2-D (linear) ones: a conv with 4-bit per-channel weights
    fails to lower. Use 4-bit for linear only (set_operator_type), or per-tensor. On a conv +
    pool + linear head (the MobileNet-like model's tail: a lowering costs per node)."""
    converted, inputs = _lower_4bit(_conv_head(), {"is_per_channel": True, **FOUR_BIT})
    with pytest.raises(AssertionError, match="qc4w"):
        qx.to_executorch(converted, inputs)
    converted, inputs = _lower_4bit(
        _conv_head(), {"is_per_channel": True}, linear_config={"is_per_channel": True, **FOUR_BIT}
    )
    program = qx.to_executorch(converted, inputs)
    assert not any("quantize" in op for op in program.not_delegated), program.summary()
    (out,) = program.load()(*inputs)
    assert (out - converted(*inputs)).abs().max().item() <= output_step(converted) * 1.001


def test_per_token_dynamic_linears_match_the_runtime_within_one_step():
    """``act_granularity="per_token"``: the reference quantizes each row of a linear's input as
    XNNPACK's dynamically quantized linear does at run time, so the transformer block's output
    (float) matches the converted model within one step of its rows quantized per token
    (measured 2e-5 step; 0.61 step with the per-tensor form). Every linear and its per-token
    quantization are delegated."""
    config = {"is_dynamic": True, "is_per_channel": True, "act_granularity": "per_token"}
    model = MODELS["transformer_block"]()
    quantizer = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(**config))
    _, converted = run_flow(model, config, quantizer)
    inputs = example_inputs(model, config)
    linears = sum(1 for n in converted.graph.nodes if n.target == torch.ops.aten.linear.default)
    program = qx.to_executorch(converted, inputs)
    assert linears >= 4 and program.delegated.get("aten.linear.default") == linears, program.summary()
    for op in ("choose_qparams_per_token_asymmetric", "quantize_per_token", "dequantize_per_token"):
        assert program.delegated.get(f"quantized_decomposed.{op}.default") == linears, program.summary()
    assert set(program.not_delegated) <= FLOAT_LEFTOVERS, program.summary()
    (out,) = program.load()(*inputs)
    ref = converted(*inputs)
    step = (ref.clamp(min=0).amax(-1, keepdim=True) - ref.clamp(max=0).amin(-1, keepdim=True)) / 255
    assert ((out - ref).abs() / step).max().item() < 0.01

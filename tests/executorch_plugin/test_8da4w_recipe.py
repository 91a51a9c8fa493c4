"""The "llm" recipe with 8da4w linears (issue #25): ``ExecuTorchQuantizer("llm", linear_bits=4,
linear_group_size=g)`` composes XNNPACK's blockwise 4-bit linears with 4-bit tables and tied
heads; ``linear_overrides`` keeps layers 8-bit or float by module name or type.

The option checks run anywhere; the program (marker ``executorch``) is built once per session
from a small decoder LM (vocab 256, dim 64, one layer; tests/executorch_plugin/conftest.py)."""

import pytest
import torch

import quantweave as qw
import quantweave_xnnpack as qx
from quantweave.testing.inspect import sqnr
from quantweave.testing.models import lm_prompts, tiny_decoder_lm
from quantweave_executorch import ExecuTorchQuantizer

QD = torch.ops.quantized_decomposed
EIGHT_DA_FOUR_W = {"linear_bits": 4, "linear_group_size": 32, "embedding_bits": 4, "embedding_group_size": 32}


def _lm(tied=False):
    return tiny_decoder_lm(vocab=256, dim=64, layers=1, heads=2, max_seq=16, tied=tied)


def _quantize(model, **options):
    prompts = lm_prompts(model, 2)
    quantizer = ExecuTorchQuantizer("llm", **options)
    prepared = qw.prepare_pt2e(torch.export.export(model, (prompts[:1],)).module(), quantizer)
    qw.calibrate(prepared, [(prompts[i : i + 1],) for i in range(2)], progress=False)
    return prompts, prepared, qw.convert_pt2e(prepared)


def _count(converted, op):
    return sum(1 for n in converted.graph.nodes if n.target == op)


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"linear_bits": 4, "linear_group_size": 48}, ("linear_group_size", "48")),
        ({"linear_bits": 8, "linear_group_size": 32}, ("linear_group_size", "linear_bits")),
        ({"linear_bits": 3}, ("linear_bits",)),
        ({"linear_bits": 4, "linear_group_size": 32, "act_granularity": "per_tensor"}, ("act_granularity",)),
        ({"linear_bits": 4, "linear_overrides": {"head": 2}}, ("linear_overrides['head']",)),
        ({"linear_bits": None, "linear_group_size": 32}, ("linear_group_size", "linear_bits")),
    ],
)
def test_bad_linear_options_name_the_option(options, names):
    with pytest.raises(ValueError) as info:
        ExecuTorchQuantizer("llm", **options)
    assert all(name in str(info.value) for name in names), str(info.value)


def test_override_keys_must_be_names_or_module_types():
    with pytest.raises(TypeError, match="linear_overrides"):
        ExecuTorchQuantizer("llm", linear_bits=4, linear_group_size=32, linear_overrides={3: 8})


def test_group_size_not_dividing_a_layer_names_it():
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 8)).eval()
    exported = torch.export.export(model, (torch.randn(2, 64),)).module()
    quantizer = ExecuTorchQuantizer("llm", linear_bits=4, linear_group_size=32, embedding_bits=None)
    with pytest.raises(qw.AnnotationError, match=r"'1'.*weight_group_size=32"):
        qw.prepare_pt2e(exported, quantizer)
    # kept 8-bit by name, the layer no longer stops the recipe
    quantizer = ExecuTorchQuantizer(
        "llm", linear_bits=4, linear_group_size=32, embedding_bits=None, linear_overrides={"1": 8}
    )
    prepared = qw.prepare_pt2e(exported, quantizer)
    assert [form for _, _, form in qx.linear_weights(prepared)] == ["int4 group-wise (32)", "int8 per-channel"]


def test_overrides_by_name_and_type_and_what_the_report_says():
    from pytest_quantweave.models import DecoderBlock

    _, prepared, converted = _quantize(
        _lm(), **EIGHT_DA_FOUR_W, linear_overrides={"head": 8, DecoderBlock: 4, "blocks.0.fc2": None}
    )
    forms = {layer: form for _, layer, form in qx.linear_weights(prepared)}
    assert forms["head"] == "int8 per-channel"
    assert forms["blocks.0.qkv"] == forms["blocks.0.fc1"] == "int4 group-wise (32)"
    assert forms["blocks.0.fc2"].startswith("float")
    assert (
        _count(converted, QD.dequantize_per_channel_group.default) == 3 + 2
    )  # qkv, proj, fc1 + the token and position tables
    assert _count(converted, QD.dequantize_per_channel.default) == 1  # the head


def test_declares_linear_per_group():
    caps = ExecuTorchQuantizer("llm", **EIGHT_DA_FOUR_W).quantization_capabilities()
    linear = [c for c in caps if c.pattern == "linear"]
    assert len(linear) == 1 and linear[0].weight.group_size == 32 and linear[0].plugin == "xnnpack"


# -- lowered and run ---------------------------------------------------------------------------------


@pytest.fixture
def tied_program(tied_lm_8da4w):
    """A tied LM (the head's weight is the token table), 8da4w with ``blocks.0.fc2`` kept 8-bit, lowered
    (tests/executorch_plugin/conftest.py: shared with test_speedups)."""
    return tied_lm_8da4w


@pytest.mark.executorch
def test_linears_delegated_tables_4bit_and_runtime_matches(tied_program):
    model, prompts, converted, program = tied_program
    linears = _count(converted, torch.ops.aten.linear.default)
    assert program.delegated.get("aten.linear.default") == linears == 5, program.summary()
    groupwise = program.delegated.get("quantized_decomposed.dequantize_per_channel_group.default", 0)
    assert groupwise == 4, program.summary()  # blocks.0.fc2 kept 8-bit
    assert program.delegated.get("quantized_decomposed.dequantize_per_channel.default") == 1, program.summary()
    assert not any("linear" in op or "quantize_per" in op for op in program.not_delegated), program.summary()
    assert any(op.startswith("quantized_decomposed.embedding_4bit") for op in program.kernels), program.summary()
    runner = program.load()
    (out,) = runner(prompts[:1])
    ref = converted(prompts[:1])
    step = (ref.clamp(min=0).amax(-1, keepdim=True) - ref.clamp(max=0).amin(-1, keepdim=True)) / 255
    assert ((out - ref).abs() / step).max().item() < 1.0
    with torch.no_grad():
        assert sqnr(model(prompts[:1]), out) > 12


@pytest.mark.executorch
def test_a_tied_table_shares_the_heads_4bit_groups(tied_program):
    _, _, converted, program = tied_program
    tables = [n for n in converted.graph.nodes if n.target == torch.ops.aten.embedding.default]
    token = tables[0].args[0]
    assert token.target == QD.dequantize_per_channel_group.default and token.args[3:7] == (-8, 7, torch.int8, 32)
    head = list(converted.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default))[-1]
    assert head.args[1].args[0].target == token.args[0].target  # one quantized copy: the head's values
    # the head's scales are bfloat16 values, so also float16 ones: the table's lookup reads them in 2 bytes
    assert program.kernels.get("quantized_decomposed.embedding_4bit.dtype_out") == 1, program.summary()

"""quantweave-embedding: declarations (conformance kit), what is annotated, what convert
stores, filters, tied tables. No ExecuTorch needed (default env)."""

import functools
import importlib
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quantweave as qw
import quantweave.authoring as qa
import quantweave_embedding
import quantweave_embedding.plugin
from quantweave.authoring import quantize_ops
from quantweave.plugin_api import QuantizerInfo, TensorQuant
from quantweave.testing.conformance import assert_plugin_conforms, check_conformance
from quantweave.testing.inspect import sqnr
from quantweave.testing.models import lm_prompts, tiny_decoder_lm
from quantweave_embedding import EmbeddingConfig, EmbeddingQuantizer
from quantweave_embedding.plugin import make_quantizer
from tests.helpers import assert_names

qa.dequantize_ops()  # registers torch.ops.quantized_decomposed
qd = torch.ops.quantized_decomposed
aten = torch.ops.aten


def quantize(model, quantizer, inputs):
    prepared = qw.prepare_pt2e(torch.export.export(model.eval(), inputs).module(), quantizer)
    prepared(*inputs)
    return prepared, qw.convert_pt2e(prepared)


def dq_of(converted, target):
    """The dequantize node each ``target`` call reads its first argument through."""
    return [n.args[0] for n in converted.graph.nodes if n.op == "call_function" and n.target == target]


class Tables(nn.Module):
    """A module table, a functional table (a buffer) and a linear that must stay float."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(40, 64)
        self.register_buffer("extra", torch.randn(12, 64))
        self.fc = nn.Linear(64, 8)

    def forward(self, tokens, ids):
        return self.fc(self.tok(tokens) + F.embedding(ids, self.extra))


def tables_inputs():
    return torch.tensor([[1, 7, 39, 3]]), torch.tensor([[0, 11, 5, 5]])


# -- plugin and declarations --------------------------------------------------------------------


def test_plugin_declares_api_2_and_two_quantizers():
    assert quantweave_embedding.plugin.QUANTWEAVE_PLUGIN_API == 2
    infos = quantweave_embedding.plugin.quantweave_quantizers()
    assert [i.name for i in infos] == ["embedding", "embedding_4bit"]
    (byte,) = infos[0].capabilities
    (nibble,) = infos[1].capabilities
    assert (byte.pattern, byte.mode.value, str(byte.output), byte.activation) == (
        "embedding",
        "weight_only",
        "float",
        None,
    )
    assert byte.weight == TensorQuant("uint8", 0, 255, "per_channel_float_qparams", False, ch_axis=0)
    assert nibble.weight == TensorQuant("int8", -8, 7, "per_group", True, ch_axis=0, group_size=32)
    assert qw.get_quantizer("embedding").quantization_capabilities() == infos[0].capabilities


def test_discovery_imports_only_declarations():
    code = (
        "import sys, quantweave_embedding.plugin as p; p.quantweave_quantizers(); "
        "print('quantweave_embedding.quantizer' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_plugin_conforms():
    assert_plugin_conforms(quantweave_embedding.plugin, name="embedding")


@pytest.mark.parametrize(
    "options",
    [{"bits": 4, "group_size": 64}, {"bits": 4, "group_size": 128, "symmetric": False}, {"bits": 8, "group_size": 32}],
    ids=["4bit-g64", "4bit-g128-affine", "8bit-g32"],
)
def test_variants_conform(options):
    info = QuantizerInfo(
        "variant",
        lambda: make_quantizer(**options),
        tuple(make_quantizer(**options).quantization_capabilities()),
        mode_options={"weight_only": {}},
    )
    assert check_conformance(info, plugin="embedding") == []


def test_config_errors_are_clear():
    with pytest.raises(ValueError) as info:
        EmbeddingConfig(bits=2)
    assert_names(info, "bits", "8 or 4")
    with pytest.raises(ValueError) as info:
        EmbeddingConfig(bits=4, group_size=1)
    assert_names(info, "group_size", ">= 2")
    with pytest.raises(ValueError) as info:
        EmbeddingConfig(bits=8, symmetric=True)
    assert_names(info, "symmetric=True", "group-wise")
    with pytest.raises(ValueError) as info:
        EmbeddingQuantizer(tied="both")
    assert_names(info, "tied", "share, own, skip")
    with pytest.raises(TypeError) as info:
        EmbeddingQuantizer().set_module_name("tok", 8)
    assert_names(info, "EmbeddingConfig or None")


# -- what is quantized, and how it is stored ------------------------------------------------------


def test_8bit_tables_are_uint8_per_row_with_float_qparams_and_the_rest_stays_float():
    torch.manual_seed(0)
    model = Tables()
    inputs = tables_inputs()
    _, converted = quantize(model, EmbeddingQuantizer(), inputs)
    dqs = dq_of(converted, aten.embedding.default)
    assert [n.target for n in dqs] == [qd.dequantize_per_channel.default] * 2
    for dq, table in zip(dqs, (model.tok.weight, model.extra), strict=True):
        stored, scale, zp, axis, qmin, qmax, dtype = dq.args
        values = getattr(converted, stored.target)
        assert (axis, qmin, qmax, dtype, values.dtype, values.shape) == (
            0,
            0,
            255,
            torch.uint8,
            torch.uint8,
            table.shape,
        )
        assert getattr(converted, zp.target).dtype == torch.float32  # float zero points (embedding_byte form)
        assert getattr(converted, scale.target).shape == (table.shape[0],)
    quantized = [n for n in converted.graph.nodes if n.op == "call_function" and n.target in qa.dequantize_ops()]
    assert {u.target for n in quantized for u in n.users} == {aten.embedding.default}  # fc, add stay float
    assert not any(n.target in quantize_ops() for n in converted.graph.nodes)  # tables folded, nothing at run time
    # ~38 dB, not the ~44 dB of 256 levels: torch's quantize_per_channel rounds x / scale, then adds the
    # float zero point and the uint8 cast truncates it, so every row is off by a fraction of a step (torchao too)
    assert sqnr(model(*inputs), converted(*inputs)) > 30


@pytest.mark.parametrize("group_size", [32, 64])
def test_4bit_tables_are_int4_values_per_group(group_size):
    torch.manual_seed(0)
    model = Tables()
    inputs = tables_inputs()
    _, converted = quantize(model, EmbeddingQuantizer(bits=4, group_size=group_size), inputs)
    for dq in dq_of(converted, aten.embedding.default):
        assert dq.target == qd.dequantize_per_channel_group.default
        stored, scale, zp, qmin, qmax, dtype, group, _ = dq.args
        values = getattr(converted, stored.target)
        assert (qmin, qmax, dtype, group, values.dtype) == (-8, 7, torch.int8, group_size, torch.int8)
        assert values.min() >= -8 and values.max() <= 7
        assert getattr(converted, scale.target).shape == (values.shape[0], 64 // group_size)
        assert not getattr(converted, zp.target).any()  # symmetric
    assert sqnr(model(*inputs), converted(*inputs)) > 15


def test_affine_4bit_groups_have_zero_points():
    torch.manual_seed(0)
    model = Tables()
    inputs = tables_inputs()
    _, converted = quantize(model, EmbeddingQuantizer(bits=4, symmetric=False), inputs)
    zps = [getattr(converted, dq.args[2].target) for dq in dq_of(converted, aten.embedding.default)]
    assert all(z.dtype == torch.int32 and z.any() for z in zps)


# -- choosing tables --------------------------------------------------------------------------


def _report(prepared, quantizer):
    return {r.node: r for r in qw.annotation_report(prepared, quantizer).nodes if r.op == "aten.embedding.default"}


def test_module_name_type_and_filter_choose_tables_and_say_why():
    inputs = tables_inputs()
    by_name = EmbeddingQuantizer().set_module_name("tok", None)
    prepared, converted = quantize(Tables(), by_name, inputs)
    (dq,) = dq_of(converted, aten.embedding.default)[1:]  # the functional table only
    assert dq.target == qd.dequantize_per_channel.default
    assert dq_of(converted, aten.embedding.default)[0].op == "get_attr"  # float table
    report = _report(prepared, by_name)
    assert [(r.status, r.kind) for r in report.values()] == [("float", "skipped"), ("quantized", "quantized")]
    assert next(iter(report.values())).reason.endswith("module name 'tok' is configured None")
    by_type = EmbeddingQuantizer(bits=4).set_module_type(nn.Embedding, EmbeddingConfig(bits=8))
    _, converted = quantize(Tables(), by_type, inputs)
    assert [n.target for n in dq_of(converted, aten.embedding.default)] == [
        qd.dequantize_per_channel.default,  # nn.Embedding: 8-bit per row
        qd.dequantize_per_channel_group.default,  # F.embedding elsewhere: the global 4-bit config
    ]
    only_modules = EmbeddingQuantizer().set_filter_function(lambda n: "tok" in str(n.meta.get("nn_module_stack")))
    prepared, converted = quantize(Tables(), only_modules, inputs)
    assert [n.op for n in dq_of(converted, aten.embedding.default)] == ["call_function", "get_attr"]
    assert "rejected by the filter function" in list(_report(prepared, only_modules).values())[1].reason


def test_tables_that_cannot_be_grouped_or_are_inputs_stay_float_with_a_reason():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(10, 48)

        def forward(self, tokens, table):
            return self.tok(tokens), F.embedding(tokens, table)

    quantizer = EmbeddingQuantizer(bits=4, group_size=32)
    inputs = (torch.tensor([[1, 2]]), torch.randn(10, 64))
    prepared = qw.prepare_pt2e(torch.export.export(Odd(), inputs).module(), quantizer)
    reasons = [r.reason for r in _report(prepared, quantizer).values()]
    assert reasons[0].endswith("embedding: rows of 48 elements do not split into groups of 32")
    assert reasons[1].endswith(
        "embedding: the table is not a constant of the model (weight-only quantization needs one)"
    )


# -- tied tables ----------------------------------------------------------------------------------


def _head_first(tied):
    import quantweave_xnnpack as qx

    head = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    return qw.ComposableQuantizer([head, EmbeddingQuantizer(tied=tied)])


def _tied_lm():
    model = tiny_decoder_lm(vocab=256, dim=64, layers=1, max_seq=16, tied=True)
    return model, (lm_prompts(model, 2),)


def test_tied_share_quantizes_the_table_once_in_the_heads_form():
    model, inputs = _tied_lm()
    _, converted = quantize(model, _head_first("share"), inputs)
    table = next(n for n in converted.graph.nodes if n.target == aten.embedding.default and n.args[1].name == "tokens")
    head = [n for n in converted.graph.nodes if n.target == aten.linear.default][-1]
    dq_e, dq_h = table.args[0], head.args[1]
    assert dq_e.target == dq_h.target == qd.dequantize_per_channel.default
    assert dq_e.args[0].target == dq_h.args[0].target  # one stored int8 tensor read by both
    stored = getattr(converted, dq_e.args[0].target)
    assert stored.dtype == torch.int8 and stored.shape == model.tok.weight.shape
    assert (dq_e.args[4], dq_e.args[5]) == (-127, 127)
    float_tables = [
        n
        for n in converted.graph.nodes
        if n.op == "get_attr" and n.users
        if (value := functools.reduce(getattr, n.target.split("."), converted)).dtype == torch.float32
        and value.shape == model.tok.weight.shape
    ]
    assert float_tables == []  # nothing reads the float table any more (export leaves a dead tok_weight)


def test_tied_own_quantizes_twice_and_skip_leaves_the_lookup_float():
    model, inputs = _tied_lm()
    _, converted = quantize(model, _head_first("own"), inputs)
    table = next(n for n in converted.graph.nodes if n.target == aten.embedding.default and n.args[1].name == "tokens")
    head = [n for n in converted.graph.nodes if n.target == aten.linear.default][-1]
    assert getattr(converted, table.args[0].args[0].target).dtype == torch.uint8
    assert getattr(converted, head.args[1].args[0].target).dtype == torch.int8
    prepared, converted = quantize(model, _head_first("skip"), inputs)
    table = next(n for n in converted.graph.nodes if n.target == aten.embedding.default and n.args[1].name == "tokens")
    assert table.args[0].op == "get_attr"
    reason = _report(prepared, _head_first("skip"))[table.name].reason
    assert "embedding: tied table (its weight is also read by" in reason and "tied='skip'" in reason


def test_tied_share_without_an_earlier_head_annotation_uses_its_own_config():
    model, inputs = _tied_lm()
    _, converted = quantize(model, EmbeddingQuantizer(bits=4), inputs)
    table = next(n for n in converted.graph.nodes if n.target == aten.embedding.default and n.args[1].name == "tokens")
    assert table.args[0].target == qd.dequantize_per_channel_group.default


def test_lazy_names():
    assert set(dir(quantweave_embedding)) >= {"EmbeddingQuantizer", "EmbeddingConfig"}
    with pytest.raises(AttributeError):
        quantweave_embedding.nope  # noqa: B018
    importlib.reload(quantweave_embedding)


# -- half-precision scales -------------------------------------------------------------------------


def _stored(converted, target=aten.embedding.default):
    """(integer values, scales, zero points or None) of the first table read by ``target``."""
    dq = dq_of(converted, target)[0]
    values = getattr(converted, dq.args[0].target)
    scales = getattr(converted, dq.args[1].target)
    zps = getattr(converted, dq.args[2].target) if isinstance(dq.args[2], torch.fx.Node) else None
    return values, scales, zps


@pytest.mark.parametrize(
    "options",
    [{"bits": 4, "group_size": 32}, {"bits": 4, "group_size": 128}, {"bits": 8, "group_size": 64}],
    ids=["4bit-g32", "4bit-g128", "8bit-g64"],
)
def test_half_scales_are_float16_values_rounded_up_and_the_integers_use_them(options):
    torch.manual_seed(0)
    model = nn.Embedding(64, 128)
    tokens = torch.arange(64)[None]
    _, full = quantize(model, EmbeddingQuantizer(**options), (tokens,))
    _, half = quantize(model, EmbeddingQuantizer(**options, scale_dtype=torch.float16), (tokens,))
    _, scales, zps = _stored(half)
    _, full_scales, _ = _stored(full)
    assert scales.dtype == torch.float32  # float32 tensors holding float16 values
    assert torch.equal(scales.to(torch.float16).float(), scales)
    assert zps is None or not zps.any()  # symmetric: no zero points
    assert bool((scales >= full_scales).all()) and bool((scales <= full_scales * (1 + 2**-10)).all())
    # the integers were computed with the rounded scales: the table dequantizes within half a step of the float one
    with torch.no_grad():
        out, ref = half(tokens)[0], model.weight
    per_element = scales.repeat_interleave(128 // scales.shape[1], 1)
    assert ((out - ref).abs() / per_element).max().item() <= 0.5 + 1e-4
    assert sqnr(ref, out) > (38 if options["bits"] == 8 else 18)


def test_half_scales_config_errors():
    with pytest.raises(ValueError) as info:
        EmbeddingConfig(bits=4, scale_dtype=torch.bfloat16)
    assert_names(info, "scale_dtype", "torch.float32", "torch.float16", "torch.bfloat16")
    assert EmbeddingConfig().scale_dtype == torch.float32  # default unchanged
    for options in ({"bits": 8}, {"bits": 4, "symmetric": False}):  # tables with zero points
        with pytest.raises(ValueError) as info:
            EmbeddingConfig(**options, scale_dtype=torch.float16)
        assert_names(info, "scale_dtype=torch.float16", "symmetric group-wise", "bits")
    huge = nn.Embedding(4, 32)
    with torch.no_grad():
        huge.weight.mul_(1e7)  # steps beyond float16's range
    # named by convert: the observer, the table, the range float16 holds and what the scales were
    with pytest.raises(qw.ConvertError) as info:
        quantize(huge, EmbeddingQuantizer(bits=4, scale_dtype=torch.float16), (torch.tensor([[0]]),))
    assert_names(info, "'weight'", "float16", "scales")

"""quantweave-executorch without ExecuTorch (default env): the recipes, their declarations and
capability tables (text and JSON, provenance, shadowing), the "llm" recipe on the decoder LM
(what is quantized, what stays float, how close the logits stay), tied heads, 4-bit packing."""

import json
import subprocess
import sys

import pytest
import torch

import quantweave as qw
import quantweave.authoring as qa
import quantweave_executorch as qe
import quantweave_executorch.plugin
from quantweave.plugin_api import ANNOTATED_BY_KEY, Capability, Mode
from quantweave.testing.conformance import assert_plugin_conforms, check_composition
from quantweave.testing.inspect import sqnr
from quantweave.testing.models import lm_prompts, tiny_decoder_lm
from quantweave_embedding import EmbeddingQuantizer
from quantweave_executorch import ExecuTorchQuantizer
from tests.helpers import assert_names

qa.dequantize_ops()  # registers torch.ops.quantized_decomposed
qd = torch.ops.quantized_decomposed
aten = torch.ops.aten

# -- the plugin -------------------------------------------------------------------------------------


def test_plugin_declares_api_2_and_the_recipes():
    assert quantweave_executorch.plugin.QUANTWEAVE_PLUGIN_API == 2
    (info,) = quantweave_executorch.plugin.quantweave_quantizers()
    keys = {(c.pattern, c.mode.value, c.plugin) for c in info.capabilities}
    assert ("embedding", "weight_only", "embedding") in keys
    assert {("linear", "dynamic", "xnnpack"), ("conv2d", "static", "xnnpack")} <= keys
    quantizer = qw.get_quantizer("executorch")
    assert isinstance(quantizer, ExecuTorchQuantizer) and quantizer.preset == "llm"


def test_discovery_imports_only_declarations():
    code = (
        "import sys, quantweave_executorch.plugin as p; p.quantweave_quantizers(); "
        "print(sorted(m for m in ('quantweave_executorch.quantizer', 'quantweave_xnnpack.quantizer', "
        "'quantweave_embedding.quantizer', 'executorch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_plugin_conforms():
    """Each mode is checked on the part of the recipe that serves it (mode_options)."""
    assert_plugin_conforms(quantweave_executorch.plugin, name="executorch")


def test_recipe_options_are_checked():
    with pytest.raises(ValueError) as info:
        ExecuTorchQuantizer("audio")
    assert_names(info, "preset", "llm, vision", "audio")
    with pytest.raises(ValueError) as info:
        ExecuTorchQuantizer("vision", embedding_bits=4)
    assert_names(info, "embedding_bits", "'llm'")
    with pytest.raises(ValueError) as info:
        ExecuTorchQuantizer("llm", embedding_bits=None, linear_bits=None)
    assert_names(info, "embedding_bits", "linear_bits", "both None")
    with pytest.raises(ValueError) as info:
        ExecuTorchQuantizer("llm", linear_bits=2)
    assert_names(info, "linear_bits", "8, 4 or None")
    assert repr(ExecuTorchQuantizer("llm", embedding_bits=4)) == (
        "ExecuTorchQuantizer('llm', embedding_bits=4; xnnpack + embedding)"
    )


def test_members_are_the_plugins_public_quantizers():
    import quantweave_xnnpack

    llm = ExecuTorchQuantizer("llm", embedding_bits=4, embedding_group_size=64, linear_bits=4)
    xnnpack, embedding = llm.quantizers
    assert isinstance(xnnpack, quantweave_xnnpack.XNNPACKQuantizer) and isinstance(embedding, EmbeddingQuantizer)
    assert (xnnpack.plugin, embedding.plugin, llm.plugin) == ("xnnpack", "embedding", "executorch")
    weight = xnnpack.global_config.weight
    assert (weight.quant_min, weight.quant_max, weight.qscheme) == (-8, 7, torch.per_channel_symmetric)
    assert xnnpack.global_config.input_activation.is_dynamic
    assert embedding.global_config.groups == 64
    (vision,) = ExecuTorchQuantizer("vision").quantizers
    assert not vision.global_config.input_activation.is_dynamic


# -- capability tables ---------------------------------------------------------------------------

LLM_TABLE = """\
pattern           mode         served by  declared by  shadowed  weight                                                activation                       output
----------------  -----------  ---------  -----------  --------  ----------------------------------------------------  -------------------------------  ------
addmm             dynamic      xnnpack    xnnpack      -         int8[-127,127] per_channel axis 1 sym                 int8[-128,127] per_token affine  float
conv2d            dynamic      xnnpack    xnnpack      -         int8[-127,127] per_channel axis 0 sym                 int8[-128,127] per_token affine  float
conv_transpose2d  dynamic      xnnpack    xnnpack      -         int8[-127,127] per_channel axis 1 sym                 int8[-128,127] per_token affine  float
embedding         weight_only  embedding  embedding    -         uint8[0,255] per_channel_float_qparams axis 0 affine  -                                float
linear            dynamic      xnnpack    xnnpack      -         int8[-127,127] per_channel axis 0 sym                 int8[-128,127] per_token affine  float
matmul_weight     dynamic      xnnpack    xnnpack      -         int8[-127,127] per_channel axis 1 sym                 int8[-128,127] per_token affine  float
mm                dynamic      xnnpack    xnnpack      -         int8[-127,127] per_channel axis 1 sym                 int8[-128,127] per_token affine  float"""  # noqa: E501


def test_llm_table_as_text_and_json_with_provenance():
    llm = ExecuTorchQuantizer("llm")
    assert qe.capability_table_text(llm) == LLM_TABLE
    records = json.loads(qe.capability_table_json(llm))
    assert [(r["pattern"], r["mode"], r["served_by"], r["plugin"], r["shadowed"]) for r in records] == [
        ("addmm", "dynamic", "xnnpack", "xnnpack", []),
        ("conv2d", "dynamic", "xnnpack", "xnnpack", []),
        ("conv_transpose2d", "dynamic", "xnnpack", "xnnpack", []),
        ("embedding", "weight_only", "embedding", "embedding", []),
        ("linear", "dynamic", "xnnpack", "xnnpack", []),
        ("matmul_weight", "dynamic", "xnnpack", "xnnpack", []),
        ("mm", "dynamic", "xnnpack", "xnnpack", []),
    ]
    for record, row in zip(records, llm.capability_table(), strict=True):
        assert Capability.from_dict(record["capability"]) == row.capability  # lossless
        assert record["served_as_declared"] and record["served_as"] == [[row.served_by, row.pattern]]
    assert {c.key: c.plugin for c in llm.quantization_capabilities()} == {
        ("linear", Mode.DYNAMIC): "xnnpack",
        ("addmm", Mode.DYNAMIC): "xnnpack",
        ("mm", Mode.DYNAMIC): "xnnpack",
        ("matmul_weight", Mode.DYNAMIC): "xnnpack",
        ("conv2d", Mode.DYNAMIC): "xnnpack",
        ("conv_transpose2d", Mode.DYNAMIC): "xnnpack",
        ("embedding", Mode.WEIGHT_ONLY): "embedding",
    }
    assert check_composition(llm) == []


def _standalone_4bit():
    quantizer = qw.get_quantizer("embedding_4bit")  # quantweave-embedding, through the registry
    quantizer.name = "embedding_4bit"  # a label distinct from the recipe's own embedding member
    return quantizer


@pytest.mark.parametrize("recipe_first", [True, False])
def test_a_pattern_served_by_one_plugin_is_shadowed_in_the_other(recipe_first):
    """quantweave-executorch's recipe and quantweave-embedding's 4-bit quantizer both declare
    (embedding, weight_only): the first member serves it, the other is shadowed; the table
    says so as text and JSON, and holds against what the members annotate on the probes."""
    members = [ExecuTorchQuantizer("llm"), _standalone_4bit()]
    composed = qw.ComposableQuantizer(members if recipe_first else members[::-1])
    by_pattern = {r["pattern"]: r for r in json.loads(qe.capability_table_json(composed))}
    row = by_pattern["embedding"]
    if recipe_first:
        assert (row["served_by"], row["served_by_plugin"], row["plugin"]) == ("executorch", "executorch", "embedding")
        assert (row["shadowed"], row["shadowed_plugins"]) == (["embedding_4bit"], ["embedding"])
        assert row["capability"]["weight"]["dtype"] == "uint8"  # the recipe's 8-bit tables
    else:
        assert (row["served_by"], row["plugin"]) == ("embedding_4bit", "embedding")
        assert (row["shadowed"], row["shadowed_plugins"]) == (["executorch"], ["executorch"])
        assert row["capability"]["weight"]["group_size"] == 32
    assert by_pattern["linear"]["served_by"] == "executorch" and by_pattern["linear"]["shadowed"] == []
    text = qe.capability_table_text(composed)
    line = next(ln for ln in text.splitlines() if ln.startswith("embedding "))
    assert ("embedding_4bit (embedding)" if recipe_first else "executorch") in line.split("  ")
    assert check_composition(composed) == []
    # and on a model: the table's server is the member that annotated
    model = tiny_decoder_lm(vocab=256, dim=64, layers=1, max_seq=16)
    prepared = qw.prepare_pt2e(torch.export.export(model, (lm_prompts(model, 1),)).module(), composed)
    claims = {n.meta.get(ANNOTATED_BY_KEY) for n in prepared.graph.nodes if n.target == aten.embedding.default}
    assert claims == {"embedding" if recipe_first else "embedding_4bit"}  # the recipe's member, or the standalone


def test_vision_table():
    vision = ExecuTorchQuantizer("vision")
    records = {(r["pattern"], r["mode"]): r for r in qe.capability_table_records(vision)}
    assert {mode for _, mode in records} == {"static"} and ("embedding", "weight_only") not in records
    assert records[("conv2d_relu", "static")]["served_by"] == "xnnpack"
    assert check_composition(vision) == []


# -- the "llm" recipe on the decoder LM --------------------------------------------------------------


def quantize(model, quantizer, prompts, calibration=4):
    exported = torch.export.export(model, (prompts[:1],)).module()
    prepared = qw.prepare_pt2e(exported, quantizer)
    for i in range(calibration):
        prepared(prompts[i : i + 1])
    return prepared, qw.convert_pt2e(prepared)


def logits(module, prompts):
    return torch.cat([module(prompts[i : i + 1]) for i in range(prompts.shape[0])])


@pytest.fixture(scope="module")
def lm():
    model = tiny_decoder_lm()  # vocab 32000, dim 128, 2 layers: 8,596,992 parameters
    prompts = lm_prompts(model, 8)  # 8 prompts x 64 tokens = 512 positions
    with torch.no_grad():
        return model, prompts, logits(model, prompts)


def _targets(node):
    return {u.target for u in node.users}


def test_embeddings_and_linears_are_quantized_as_declared_and_the_rest_stays_float(lm):
    model, prompts, _ = lm
    prepared, converted = quantize(model, ExecuTorchQuantizer("llm"), prompts)
    nodes = list(converted.graph.nodes)
    embeddings = [n for n in nodes if n.target == aten.embedding.default]
    linears = [n for n in nodes if n.target == aten.linear.default]
    assert len(embeddings) == 2 and len(linears) == 9  # tok + pos; 4 per block + head
    for emb in embeddings:  # uint8 table, float scale and zero point per row
        dq = emb.args[0]
        assert dq.target == qd.dequantize_per_channel.default and dq.args[3:] == (0, 0, 255, torch.uint8)
    for lin in linears:  # int8 per-channel weight, activation quantized per token at run time, float output
        weight, x = lin.args[1], lin.args[0]
        assert weight.target == qd.dequantize_per_channel.default and weight.args[3:] == (0, -127, 127, torch.int8)
        assert x.target == qd.dequantize_per_token.default and x.args[3:] == (-128, 127, torch.int8, torch.float32)
        assert x.args[0].target == qd.quantize_per_token.default
        # scale <- getitem <- choose_qparams_per_token_asymmetric
        assert x.args[1].args[0].target == qd.choose_qparams_per_token_asymmetric.default
    machinery = set(qa.quantize_ops()) | set(qa.dequantize_ops()) | {qd.choose_qparams_per_token_asymmetric.default}
    dq_users = {t for n in nodes if n.target in qa.dequantize_ops() for t in _targets(n)}
    assert dq_users == {aten.embedding.default, aten.linear.default}  # nothing else reads quantized values
    floats = {n.target for n in nodes if n.op == "call_function" and n.target not in machinery}
    assert {aten.layer_norm.default, aten.softmax.int, aten.gelu.default, aten.matmul.default} <= floats
    report = qw.annotation_report(prepared, ExecuTorchQuantizer("llm"))
    by = {(r.op, r.quantizer) for r in report.nodes if r.status == "quantized"}
    assert by == {("aten.embedding.default", "embedding"), ("aten.linear.default", "xnnpack")}


@pytest.mark.parametrize(
    ("options", "min_sqnr", "min_top1"),
    [
        ({}, 35.0, 0.95),  # measured 38.8 dB, 97.3 %
        ({"embedding_bits": 4, "embedding_group_size": 32}, 18.0, 0.75),  # measured 20.4 dB, 79.7 %
        ({"embedding_bits": 4, "embedding_group_size": 128}, 17.0, 0.75),  # measured 19.1 dB, 78.9 %
        ({"embedding_bits": 4, "linear_bits": 4}, 16.0, 0.7),  # measured 18.6 dB, 73.2 %
    ],
    ids=["8bit", "4bit-g32", "4bit-g128", "4bit-4bit-linears"],
)
def test_logits_stay_close_to_float(lm, options, min_sqnr, min_top1):
    """SQNR of the logits and top-1 token agreement with the float model on 8 fixed prompts
    of 64 tokens (512 positions). The model is randomly initialised, so top-1 margins are
    small: 4-bit tables move the argmax on about one position in five."""
    model, prompts, reference = lm
    _, converted = quantize(model, ExecuTorchQuantizer("llm", **options), prompts)
    with torch.no_grad():
        out = logits(converted, prompts)
    top1 = (out.argmax(-1) == reference.argmax(-1)).float().mean().item()
    assert sqnr(reference, out) > min_sqnr, f"SQNR {sqnr(reference, out):.1f} dB"
    assert top1 >= min_top1, f"top-1 agreement {top1:.3f}"


# -- tied head -----------------------------------------------------------------------------------


def _tied():
    model = tiny_decoder_lm(vocab=2048, tied=True)
    return model, lm_prompts(model, 4)


def _table_reads(converted):
    embedding = next(n for n in converted.graph.nodes if n.target == aten.embedding.default)
    head = [n for n in converted.graph.nodes if n.target == aten.linear.default][-1]
    return embedding.args[0], head.args[1]


@pytest.mark.parametrize("linear_bits", [8, 4])
def test_tied_head_is_quantized_once_in_the_heads_form(linear_bits):
    model, prompts = _tied()
    _, converted = quantize(model, ExecuTorchQuantizer("llm", embedding_bits=4, linear_bits=linear_bits), prompts)
    for_table, for_head = _table_reads(converted)
    assert for_table.args[0].target == for_head.args[0].target  # one stored int8 table
    lo = -127 if linear_bits == 8 else -8
    assert for_table.target == for_head.target == qd.dequantize_per_channel.default
    assert for_table.args[3:] == (0, lo, -lo if linear_bits == 8 else 7, torch.int8)
    # the untied position table is 4-bit (the error that dominates: 23 dB with 8-bit linears)
    with torch.no_grad():
        assert sqnr(logits(model, prompts), logits(converted, prompts)) > (20 if linear_bits == 8 else 15)


def test_tied_own_quantizes_the_table_twice_like_executorch():
    model, prompts = _tied()
    _, converted = quantize(model, ExecuTorchQuantizer("llm", tied="own"), prompts)
    for_table, for_head = _table_reads(converted)
    assert for_table.args[0].target != for_head.args[0].target
    assert (for_table.args[-1], for_head.args[-1]) == (torch.uint8, torch.int8)


# -- 4-bit packing (pure torch) ---------------------------------------------------------------


def test_pack_int4_layout_and_round_trip():
    values = torch.tensor([[-8, 7, 0, -1], [3, -3, 5, -6]], dtype=torch.int8)
    packed = qe.pack_int4(values)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 2)
    assert packed[0].tolist() == [(0 << 4) | 15, (8 << 4) | 7]  # value + 8, even element in the high nibble
    assert torch.equal(qe.unpack_int4(packed), values)
    every = torch.arange(-8, 8, dtype=torch.int8).repeat(3, 2)
    assert torch.equal(qe.unpack_int4(qe.pack_int4(every)), every)
    with pytest.raises(ValueError) as info:
        qe.pack_int4(torch.tensor([[8, 0]], dtype=torch.int8))
    assert_names(info, "[-8, 7]")
    with pytest.raises(ValueError) as info:
        qe.pack_int4(torch.zeros(2, 3, dtype=torch.int8))
    assert_names(info, "even number of columns")


def test_to_executorch_says_what_to_install_when_executorch_is_missing(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_executorch(name, *args, **kwargs):
        if name == "executorch" or name.startswith("executorch."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_executorch)
    for name in [m for m in sys.modules if m == "executorch" or m.startswith("executorch.")]:
        monkeypatch.delitem(sys.modules, name)
    model = tiny_decoder_lm(vocab=64, dim=32, layers=1, max_seq=8)
    with pytest.raises(ImportError) as info:
        qe.to_executorch(model, (lm_prompts(model, 1),))
    assert_names(info, "ExecuTorch 1.5.1", "pip install --no-deps")


# -- lowering without ExecuTorch -----------------------------------------------------------------


def test_to_executorch_says_what_to_install_naming_itself_when_executorch_is_missing(monkeypatch):
    """The lowering reuses quantweave-xnnpack's public steps (import_executorch, lower_to_edge):
    the error names this plugin's API and its extra."""
    import quantweave_xnnpack as qx

    for name in ("executorch", "executorch.exir", "executorch.backends.xnnpack.partition.xnnpack_partitioner"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(qx.ExecuTorchNotInstalledError) as info:
        qe.to_executorch(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    assert_names(info, "quantweave_executorch.to_executorch")
    assert "quantweave-executorch[executorch]" in str(info.value)
    with pytest.raises(qx.ExecuTorchNotInstalledError) as info:
        qx.lower_to_edge(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    assert_names(info, "quantweave_xnnpack.lower_to_edge")

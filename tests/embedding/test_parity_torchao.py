"""Peer parity of quantweave-embedding (tox env ``xnnpack``, marker ``executorch``: torchao 0.18
is installed there, without its dependencies, as ExecuTorch needs it).

- 8-bit tables against torchao's PT2E ``EmbeddingQuantizer`` with torchao's
  ``prepare_pt2e`` / ``convert_pt2e``: the same annotations, the same stored tables (values,
  scales, zero points) and identical outputs.
- 4-bit tables (groups of 32, symmetric) against torchao's ``IntxWeightOnlyConfig(int4,
  PerGroup(32))`` with the ``"affine"`` qparams algorithm, the source transform ExecuTorch's
  LLM export applies to embeddings (``EmbeddingQuantHandler(bitwidth=4, group_size=32,
  quantize_with_hqq=False)``): the same int4 values and scales.

Intended difference, asserted: a table that is not a constant of the model (a graph input)
is left float by us; torchao annotates it (and its weight-only observer then observes an
input at run time).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quantweave as qw
from quantweave.testing.inspect import qdq_summary
from quantweave.testing.models import lm_prompts, tiny_decoder_lm
from quantweave_embedding import EmbeddingQuantizer

pytestmark = pytest.mark.executorch
ao = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e", reason="needs torchao 0.18 (tox -e xnnpack)")
peer_embedding = pytest.importorskip("torchao.quantization.pt2e.quantizer.embedding_quantizer")

KEY = "quantization_annotation"


def spec_key(spec):
    if spec is None:
        return None
    ctr = spec.observer_or_fake_quant_ctr
    observer = getattr(getattr(ctr, "p", None), "func", ctr).__name__
    keywords = dict(getattr(getattr(ctr, "p", None), "keywords", {}))
    return (spec.dtype, spec.quant_min, spec.quant_max, spec.qscheme, spec.ch_axis, spec.is_dynamic, observer, keywords)


def annotations(gm):
    return {
        node.name: {producer.name: spec_key(spec) for producer, spec in node.meta[KEY].input_qspec_map.items()}
        for node in gm.graph.nodes
        if node.op == "call_function" and node.meta.get(KEY) is not None
    }


class Tables(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(300, 64)
        self.register_buffer("extra", torch.randn(40, 64) * 3)
        self.fc = nn.Linear(64, 8)

    def forward(self, tokens, ids):
        return self.fc(self.tok(tokens) + F.embedding(ids, self.extra))


CASES = {
    "tables": lambda: (Tables().eval(), (torch.randint(0, 300, (1, 12)), torch.randint(0, 40, (1, 12)))),
    "decoder_lm": lambda: (lambda m: (m, (lm_prompts(m, 1),)))(tiny_decoder_lm(vocab=2048)),
}


def flow(case, quantizer, prepare, convert):
    torch.manual_seed(0)
    model, inputs = CASES[case]()
    prepared = prepare(torch.export.export(model, inputs).module(), quantizer)
    prepared(*inputs)
    return prepared, convert(prepared), inputs


@pytest.mark.parametrize("case", list(CASES))
def test_8bit_tables_match_torchaos_embedding_quantizer(case):
    prepared, converted, inputs = flow(case, EmbeddingQuantizer(), qw.prepare_pt2e, qw.convert_pt2e)
    peer_prepared, peer_converted, _ = flow(case, peer_embedding.EmbeddingQuantizer(), ao.prepare_pt2e, ao.convert_pt2e)
    ours, peer = annotations(prepared), annotations(peer_prepared)
    assert len(ours) == 2 and ours == peer
    assert qdq_summary(converted) == qdq_summary(peer_converted)
    stored = sorted(n.target for n in converted.graph.nodes if n.op == "get_attr" and "frozen" in n.target)
    peer_stored = sorted(n.target for n in peer_converted.graph.nodes if n.op == "get_attr" and "frozen" in n.target)
    assert [getattr(converted, t).dtype for t in stored] == [torch.uint8] * 2
    for mine, theirs in zip(stored, peer_stored, strict=True):
        assert torch.equal(getattr(converted, mine), getattr(peer_converted, theirs))
    assert torch.equal(converted(*inputs), peer_converted(*inputs))


def test_4bit_groups_match_the_source_transform_executorch_applies():
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig, quantize_

    model = tiny_decoder_lm(vocab=1024)
    inputs = (lm_prompts(model, 1),)
    prepared = qw.prepare_pt2e(torch.export.export(model, inputs).module(), EmbeddingQuantizer(bits=4, group_size=32))
    converted = qw.convert_pt2e(prepared)
    dq = next(n.args[0] for n in converted.graph.nodes if n.target == torch.ops.aten.embedding.default)
    values, scales = getattr(converted, dq.args[0].target), getattr(converted, dq.args[1].target)

    peer = nn.Embedding(1024, 128)
    peer.weight = nn.Parameter(model.tok.weight.detach().clone())
    config = IntxWeightOnlyConfig(
        weight_dtype=torch.int4, granularity=PerGroup(32), intx_choose_qparams_algorithm="affine"
    )
    quantize_(peer, config, lambda module, fqn: isinstance(module, nn.Embedding))
    assert torch.equal(peer.weight.qdata.to(torch.int8), values)
    assert torch.equal(peer.weight.scale.reshape(scales.shape).float(), scales)
    assert not peer.weight.zero_point.any()  # symmetric, as ours


def test_difference_a_table_that_is_an_input_is_left_float():
    class InputTable(nn.Module):
        def forward(self, ids, table):
            return F.embedding(ids, table)

    inputs = (torch.tensor([[1, 2]]), torch.randn(5, 8))
    ours = EmbeddingQuantizer().annotate(torch.export.export(InputTable(), inputs).module())
    peer = peer_embedding.EmbeddingQuantizer().annotate(torch.export.export(InputTable(), inputs).module())
    assert annotations(ours) == {}
    assert list(annotations(peer).values()) == [{"table": spec_key(EmbeddingQuantizer().global_config.weight_spec())}]

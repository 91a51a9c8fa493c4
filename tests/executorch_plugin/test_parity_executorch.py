"""Peer parity of the "llm" recipe against ExecuTorch 1.5.1's own composition of the two
quantizers (tox env ``xnnpack``, marker ``executorch``): ``get_pt2e_quantizers`` of
``executorch.extension.llm.export.quantizer_lib`` with ``--pt2e_quantize embedding,xnnpack_dynamic``
(torchao's ``EmbeddingQuantizer`` + ExecuTorch's ``XNNPACKQuantizer`` with a dynamic
per-channel config, in torchao's ``ComposableQuantizer``), prepared and converted by
torchao 0.18.

On the untied decoder LM: the same annotations, the same quantize/dequantize decisions,
identical converted outputs, and the same converted graph up to node and attribute names (every
op, every edge, every constant to the byte), so ``quantweave_executorch.to_executorch`` makes
the same program of both up to names: it is lowered once (issue #23; before, both were lowered
and gave programs of the same size, kernels and delegates, with identical runtime outputs, their
bytes differing in 63 of 1,591,168: XNNPACK value ids numbered after the constants' names).

Intended difference, asserted: on a tied head the peer quantizes the table twice (uint8 for
the lookup, int8 for the head: what ``tied="own"`` reproduces exactly); the recipe's default
``tied="share"`` quantizes it once, in the head's form.
"""

import pytest
import torch

import quantweave as qw
from quantweave.testing.inspect import qdq_summary, sqnr
from quantweave.testing.models import lm_prompts, tiny_decoder_lm
from quantweave_executorch import ExecuTorchQuantizer
from tests.helpers import spec_key
from tests.xnnpack._cases import graph_structure

pytestmark = pytest.mark.executorch
pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e xnnpack)")
ao = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ao_quantizer = pytest.importorskip("torchao.quantization.pt2e.quantizer")
#: ExecuTorch's XNNPACKQuantizer quantizes dynamic activations per tensor (the "llm" default is per token)
PARITY = "per_tensor"

KEY = "quantization_annotation"


def peer_quantizer():
    from executorch.extension.llm.export import quantizer_lib as lib

    options = lib.get_pt2e_quantization_params("embedding,xnnpack_dynamic", None)
    return ao_quantizer.ComposableQuantizer(lib.get_pt2e_quantizers(options))


def annotations(gm):
    out = {}
    for node in gm.graph.nodes:
        annotation = node.meta.get(KEY)
        if node.op != "call_function" or annotation is None:
            continue
        inputs = {p.name: spec_key(s) for p, s in annotation.input_qspec_map.items()}
        if any(v is not None for v in inputs.values()) or annotation.output_qspec is not None:
            out[node.name] = (inputs, spec_key(annotation.output_qspec))
    return out


def flow(model, prompts, quantizer, prepare, convert):
    prepared = prepare(torch.export.export(model, (prompts[:1],)).module(), quantizer)
    for i in range(prompts.shape[0]):
        prepared(prompts[i : i + 1])
    return prepared, convert(prepared)


def _frozen(converted):
    return sorted(
        (n.target, tuple(getattr(converted, n.target).shape), getattr(converted, n.target).dtype)
        for n in converted.graph.nodes
        if n.op == "get_attr" and "frozen" in n.target
    )


def test_same_annotations_qparams_outputs_and_programs_as_executorchs_composition(lm4096_per_tensor):
    # ours: ExecuTorchQuantizer("llm", act_granularity=PARITY) on the vocab-4096 LM, calibrated on the 3
    # prompts in order and lowered, shared with test_executorch_runtime (tests/executorch_plugin/conftest.py)
    model, prompts, prepared, converted, program = lm4096_per_tensor
    peer_prepared, peer_converted = flow(model, prompts, peer_quantizer(), ao.prepare_pt2e, ao.convert_pt2e)
    ours = annotations(prepared)
    assert len(ours) == 2 + 9  # two tables, nine linears
    assert ours == annotations(peer_prepared)
    assert qdq_summary(converted) == qdq_summary(peer_converted)
    assert _frozen(converted) == _frozen(peer_converted)
    x = prompts[:1]
    reference = peer_converted(x)
    assert torch.equal(converted(x), reference)
    # one graph: the peer's program is this program (not lowered a second time, issue #23)
    assert graph_structure(converted) == graph_structure(peer_converted)
    assert program.delegated.get("aten.linear.default") == 9, program.summary()
    (runtime,) = program.load()(x)
    # per-tensor activations: within the gap test_executorch_runtime measures (SQNR 39.2 dB)
    assert runtime.shape == reference.shape and sqnr(reference, runtime) > 30, sqnr(reference, runtime)


def test_difference_tied_head_quantized_once_not_twice():
    model = tiny_decoder_lm(vocab=2048, tied=True)
    prompts = lm_prompts(model, 2)
    _, peer_converted = flow(model, prompts, peer_quantizer(), ao.prepare_pt2e, ao.convert_pt2e)
    _, own = flow(
        model, prompts, ExecuTorchQuantizer("llm", tied="own", act_granularity=PARITY), qw.prepare_pt2e, qw.convert_pt2e
    )
    _, shared = flow(
        model, prompts, ExecuTorchQuantizer("llm", act_granularity=PARITY), qw.prepare_pt2e, qw.convert_pt2e
    )
    table = (2048, 128)

    def tables(converted):
        return [dtype for _, shape, dtype in _frozen(converted) if shape == table]

    assert sorted(map(str, tables(peer_converted))) == ["torch.int8", "torch.uint8"]  # twice
    assert qdq_summary(own) == qdq_summary(peer_converted) and _frozen(own) == _frozen(peer_converted)
    assert torch.equal(own(prompts[:1]), peer_converted(prompts[:1]))
    assert tables(shared) == [torch.int8]  # once, the head's int8 rows

"""Programs several modules of tests/executorch_plugin lower, built once per session (each
ExecuTorch lowering of the decoder LM costs tens of CPU seconds). The fixtures hand out the
same objects to every test: a test must not mutate them (none does: ``to_executorch``,
``rewrite_embeddings`` and the runtime leave their input as it was)."""

import pytest
import torch

import quantweave as qw
from quantweave.testing.models import lm_prompts, tiny_decoder_lm


def _quantize(model, prompts, quantizer):
    """Export on the first prompt, calibrate on up to 4 prompts in order, convert."""
    prepared = qw.prepare_pt2e(torch.export.export(model, (prompts[:1],)).module(), quantizer)
    for i in range(min(4, prompts.shape[0])):
        prepared(prompts[i : i + 1])
    return prepared, qw.convert_pt2e(prepared)


@pytest.fixture(scope="session")
def lm4096_per_tensor():
    """(model, prompts, prepared, converted, program): the untied decoder LM of vocab 4096, the
    "llm" recipe with ExecuTorch's per-tensor dynamic activations, calibrated on 3 prompts,
    lowered. Parity with ExecuTorch's composition, and why the recipe quantizes per token."""
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e executorch)")
    import quantweave_executorch as qe

    model = tiny_decoder_lm(vocab=4096)
    prompts = lm_prompts(model, 3)
    prepared, converted = _quantize(model, prompts, qe.ExecuTorchQuantizer("llm", act_granularity="per_tensor"))
    return model, prompts, prepared, converted, qe.to_executorch(converted, (prompts[:1],))


@pytest.fixture(scope="session")
def lm4096_tables4():
    """(model, prompts, converted, program): the untied decoder LM of vocab 4096 with 4-bit
    tables (groups of 32, float32 scales) and float linears, lowered on the first of 2 prompts
    (weight-only: calibration does not change the converted model)."""
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e executorch)")
    import quantweave_executorch as qe

    model = tiny_decoder_lm(vocab=4096)
    prompts = lm_prompts(model, 2)
    _, converted = _quantize(model, prompts, qe.ExecuTorchQuantizer(embedding_bits=4, linear_bits=None))
    return model, prompts, converted, qe.to_executorch(converted, (prompts[:1],))

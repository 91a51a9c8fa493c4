"""Programs several modules of tests/executorch_plugin lower, built once per session (each
ExecuTorch lowering of the decoder LM costs seconds to tens of CPU seconds). The fixtures hand out the
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


@pytest.fixture(scope="session")
def tied_lm_8da4w():
    """(model, prompts, converted, program): a small tied decoder LM (vocab 256, dim 64, one layer;
    the head's weight is the token table), 8da4w (4-bit linears and tables in groups of 32) with
    ``blocks.0.fc2`` kept 8-bit, calibrated on 2 prompts, lowered (test_8da4w_recipe, test_speedups)."""
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e executorch)")
    import quantweave_executorch as qe

    model = tiny_decoder_lm(vocab=256, dim=64, layers=1, heads=2, max_seq=16, tied=True)
    prompts = lm_prompts(model, 2)
    quantizer = qe.ExecuTorchQuantizer(
        "llm",
        linear_bits=4,
        linear_group_size=32,
        embedding_bits=4,
        embedding_group_size=32,
        linear_overrides={"blocks.0.fc2": 8},
    )
    prepared = qw.prepare_pt2e(torch.export.export(model, (prompts[:1],)).module(), quantizer)
    qw.calibrate(prepared, [(prompts[i : i + 1],) for i in range(2)], progress=False)
    converted = qw.convert_pt2e(prepared)
    return model, prompts, converted, qe.to_executorch(converted, (prompts[:1],))

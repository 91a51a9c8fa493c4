"""8da4w converts to exactly what it did before the quantize-time work of issue 25.

The faster group-wise quantize (``_modules/group_quantize``), the observer copies convert
makes (``_modules/observer_copies``), the group observer that skips an unchanged weight and
the code generated on first use must leave every byte of the result as it was: the digests
below (SHA-256 of the generated code, then of every state-dict entry's name, dtype, shape and
bytes) were taken with the code before those changes (commit 7c05ee2), on a small decoder LM
through ``ExecuTorchQuantizer("llm", linear_bits=4, linear_group_size=32, embedding_bits=4,
embedding_group_size=32)``: symmetric and affine 4-bit tables, without and with calibration,
and with blocks small enough (1024 elements) that the large weights take the blocked path."""

import hashlib

import pytest
import torch

import quantweave as qw
from quantweave._modules import chunked_quantize
from quantweave.testing.models import lm_prompts, tiny_decoder_lm

pytest.importorskip("quantweave_executorch")

PREPARED = "7516de638708b6f2eb5c6e710579cde4ed9697618720eef5290dd80417129474"
CONVERTED = {
    # (embedding_symmetric, calibrated): digest of the converted module
    (None, False): "94c6fead19a1893a6cde2c575695bae46d4e8f7dcf5f61c5d9c84a9d3b79d9c2",
    (False, False): "3aeebe61d8327d8bda0e5bf39a0a4a61cac30ec3b49a61cb9e7e013ca9184d0d",
    (None, True): "94c6fead19a1893a6cde2c575695bae46d4e8f7dcf5f61c5d9c84a9d3b79d9c2",  # as without: weights only,
}


def digest(gm: torch.fx.GraphModule) -> str:
    h = hashlib.sha256(gm.code.encode())
    for name, t in sorted(gm.state_dict().items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@pytest.fixture(scope="module")
def exported():
    model = tiny_decoder_lm(vocab=96, dim=64, layers=1, heads=2, max_seq=16)
    prompts = lm_prompts(model, 2)
    return torch.export.export(model, (prompts[:1],)).module(), prompts


@pytest.mark.parametrize(("symmetric", "calibrated"), list(CONVERTED))
def test_8da4w_converts_to_the_same_bytes(exported, symmetric, calibrated, monkeypatch):
    import quantweave_executorch as qe

    module, prompts = exported
    monkeypatch.setattr(chunked_quantize, "BLOCK_ELEMENTS", 1024)  # the 96 x 64 tables and head: 6 blocks
    quantizer = qe.ExecuTorchQuantizer(
        "llm",
        linear_bits=4,
        linear_group_size=32,
        embedding_bits=4,
        embedding_group_size=32,
        embedding_symmetric=symmetric,
    )
    prepared = qw.prepare_pt2e(module, quantizer)
    assert digest(prepared) == PREPARED
    if calibrated:
        for i in range(2):
            prepared(prompts[i : i + 1])
            prepared(prompts[i : i + 1])  # the same weights again: skipped by the group observers
    assert digest(qw.convert_pt2e(prepared)) == CONVERTED[(symmetric, calibrated)]


def test_round_up_to_bf16_integer_path_matches_the_float_path(monkeypatch):
    """Large scales are rounded up in integer arithmetic: the same bits as the float ops (the
    smallest bfloat16 value >= each scale), on every kind of positive finite float32."""
    import quantweave_xnnpack._blockwise as blockwise

    def float_path(scale):
        rounded = scale.to(torch.bfloat16)
        below = rounded.to(torch.float32) < scale
        rounded = torch.where(below, torch.nextafter(rounded, torch.full_like(rounded, float("inf"))), rounded)
        return rounded.to(torch.float32)

    bits = torch.arange(1, 0x7F800000, 4099, dtype=torch.int64).to(torch.int32)  # subnormals to the largest
    scales = [
        bits.view(torch.float32),
        torch.tensor([2.0**-12, 1.0, 1.00390625, 1.0039063, torch.finfo(torch.float32).max]),
        torch.rand(64, 4).t(),  # not contiguous
    ]
    monkeypatch.setattr(blockwise, "_INTEGER_PATH_MIN", 1)
    for scale in scales:
        assert torch.equal(blockwise.round_up_to_bf16(scale).view(torch.int32), float_path(scale).view(torch.int32))
    for odd in (torch.tensor([0.0, 1.0]), torch.tensor([-1.5, 1.0]), torch.tensor([float("inf"), 1.0])):
        assert torch.equal(blockwise.round_up_to_bf16(odd), float_path(odd))  # the float path, as before
    nan = blockwise.round_up_to_bf16(torch.tensor([float("nan"), 1.0]))
    assert bool(torch.isnan(nan[0])) and nan[1] == 1.0


def test_round_up_to_bf16_in_place_rounds_in_the_scales_own_storage(monkeypatch):
    """``in_place=True`` (the observer's own freshly computed scales): the same bits, in the
    tensor given; a tensor it cannot round in place (not contiguous, not float32) and every
    value of the float path get a new tensor, as without it."""
    import quantweave_xnnpack._blockwise as blockwise

    monkeypatch.setattr(blockwise, "_INTEGER_PATH_MIN", 1)
    scale = torch.rand(128, 4) + 1e-3
    expected = blockwise.round_up_to_bf16(scale)
    given = scale.clone()
    rounded = blockwise.round_up_to_bf16(given, in_place=True)
    assert torch.equal(rounded.view(torch.int32), expected.view(torch.int32))
    assert rounded.untyped_storage().data_ptr() == given.untyped_storage().data_ptr()
    for other in (scale.t(), scale.double(), torch.tensor([0.0, 1.0])):
        before = other.clone()
        out = blockwise.round_up_to_bf16(other, in_place=True)
        assert torch.equal(out, blockwise.round_up_to_bf16(before)) and torch.equal(other, before)
        assert out.untyped_storage().data_ptr() != other.untyped_storage().data_ptr()


def test_bf16_observer_rounds_its_own_scales_in_place_only():
    """The observer's scales come out the same and its min / max stay as they were. Where a
    class between it and PerGroupMinMaxObserver returns a scale tensor it holds, that tensor is
    not rounded in place."""
    from quantweave.observers import PerGroupMinMaxObserver
    from quantweave_xnnpack._blockwise import BF16ScalePerGroupMinMaxObserver, round_up_to_bf16

    weight = torch.randn(1024, 128)  # 4096 scales: the integer path (_INTEGER_PATH_MIN)
    observer = BF16ScalePerGroupMinMaxObserver(group_size=32, quant_min=-8, quant_max=7, eps=2**-12)
    observer(weight)
    low, high = observer.min_val.clone(), observer.max_val.clone()
    scale, _ = observer.calculate_qparams()
    plain, _ = PerGroupMinMaxObserver.calculate_qparams(observer)
    assert torch.equal(scale, round_up_to_bf16(plain))
    assert torch.equal(observer.min_val, low) and torch.equal(observer.max_val, high)

    class HoldsScale(PerGroupMinMaxObserver):
        def calculate_qparams(self):
            self.held, zero_point = super().calculate_qparams()
            return self.held, zero_point

    class Holding(BF16ScalePerGroupMinMaxObserver, HoldsScale):
        pass

    holding = Holding(group_size=32, quant_min=-8, quant_max=7, eps=2**-12)
    holding(weight)
    scale, _ = holding.calculate_qparams()
    assert torch.equal(scale, round_up_to_bf16(plain)) and torch.equal(holding.held, plain)

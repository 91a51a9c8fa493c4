"""The test session's fake-tensor dispatch cache for the quant ops (tests/_fake_cache.py): a quant op's fake
dispatch is made once and then served from torch's cache, any other custom op is still turned away, torch's
check and an empty cache come back after the block; lowered programs are byte-identical with and without it
(marker ``executorch``)."""

import collections

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests import _fake_cache
from tests.helpers import xnnpack_static_conv_linear

ORIGINAL = FakeTensorMode.__dict__["_validate_cache_key"]
while hasattr(ORIGINAL, "__wrapped__"):  # the session's, if it is on
    ORIGINAL = ORIGINAL.__wrapped__


@pytest.fixture
def plain(monkeypatch):
    """torch's own check and an empty cache, for the test (the session's put back after it)."""
    monkeypatch.setattr(FakeTensorMode, "_validate_cache_key", ORIGINAL)
    FakeTensorMode.cache.clear()
    yield
    FakeTensorMode.cache.clear()


@pytest.fixture
def custom_op():
    library = torch.library.Library("qw_test_fake_cache", "DEF")
    library.define("twice(Tensor x) -> Tensor")
    library.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    library.impl("twice", lambda x: torch.empty_like(x), "Meta")
    yield torch.ops.qw_test_fake_cache.twice.default
    library._destroy()


def _dispatch_counts(op, *args):
    """(hits, turned away as non-builtin) of FakeTensorMode over two calls of ``op`` on fake ``args``."""
    hits, bypasses = FakeTensorMode.cache_hits, FakeTensorMode.cache_bypasses["non-builtin"]
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        first, second = op(*fake), op(*fake)
    assert first.shape == second.shape and first.dtype == second.dtype
    return FakeTensorMode.cache_hits - hits, FakeTensorMode.cache_bypasses["non-builtin"] - bypasses


def test_a_quant_op_is_cached_inside_the_block_and_not_outside(plain, custom_op):
    import quantweave.authoring as qa

    qa.dequantize_ops()  # registers torch.ops.quantized_decomposed
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    args = (torch.randn(4, 8), 0.1, 0, -128, 127, torch.int8)
    assert _dispatch_counts(quantize, *args) == (0, 2), "torch alone: turned away on each call"
    with _fake_cache.installed() as stats:
        assert _dispatch_counts(quantize, *args) == (1, 0), "made once, then served"
        assert stats[_fake_cache.ADMITTED] == 1
        hits, turned_away = _dispatch_counts(custom_op, torch.randn(3))
        assert (hits, turned_away) == (0, 2), "another namespace's custom op"
        assert stats[_fake_cache.ADMITTED] == 1
    assert FakeTensorMode.__dict__["_validate_cache_key"] is ORIGINAL
    assert not FakeTensorMode.cache, "nothing admitted outlives the block"
    assert _dispatch_counts(quantize, *args) == (0, 2)


def test_nested_blocks_leave_the_outer_one_in_place(plain):
    outer = collections.Counter()
    with _fake_cache.installed(outer):
        session = FakeTensorMode.__dict__["_validate_cache_key"]
        with _fake_cache.installed():
            assert FakeTensorMode.__dict__["_validate_cache_key"].__wrapped__ is session
        assert FakeTensorMode.__dict__["_validate_cache_key"] is session
    assert FakeTensorMode.__dict__["_validate_cache_key"] is ORIGINAL


@pytest.mark.executorch
def test_lowered_programs_are_identical_with_and_without_the_cache(plain):
    """The same .pte bytes with quant ops' fake dispatches cached as with torch's check alone: a
    static-quantized Conv2d + Linear through quantweave_xnnpack, and the same model in float. The zoo,
    tests/xnnpack and tests/executorch_plugin programs were checked the same way by
    ``python -m tests._lowering_check``."""
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e executorch)")
    import quantweave_xnnpack as qx

    model, converted, x = xnnpack_static_conv_linear()
    turned_away = FakeTensorMode.cache_bypasses["non-builtin"]
    without = [qx.to_executorch(m, (x,)).buffer for m in (converted, model)]
    assert FakeTensorMode.cache_bypasses["non-builtin"] > turned_away, "torch turned quant ops away"
    with _fake_cache.installed() as stats:
        cached = [qx.to_executorch(m, (x,)).buffer for m in (converted, model)]
        assert stats[_fake_cache.ADMITTED] > 0, "the lowering cached quant ops"
    assert cached == without

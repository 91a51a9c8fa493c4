"""The test session's memo of torch's preservable-CIA-op walk (tests/executorch_speedups.py): it
returns what torch's function returns, sees an op registered (or removed) after it was filled,
and lowered programs are byte-identical with and without it (marker ``executorch``)."""

import inspect

import pytest
import torch
from torch._export import utils

from tests.executorch_speedups import NAME, cia_ops_collected_once, memoized

ORIGINAL = inspect.unwrap(getattr(utils, NAME))


@pytest.fixture
def memo():
    stats = {"computed": 0, "reused": 0}
    return memoized(ORIGINAL, stats), stats


def test_returns_what_torch_returns_and_reuses_it_while_the_registry_is_unchanged(memo):
    collect, stats = memo
    first = collect()
    assert first == ORIGINAL()
    assert stats == {"computed": 1, "reused": 0}
    second = collect()
    assert second == first and stats == {"computed": 1, "reused": 1}
    second.clear()  # each caller its own copy
    assert collect() == first


def test_an_op_registered_or_removed_after_the_first_call_is_seen(memo):
    collect, stats = memo
    before = collect()
    library = torch.library.Library("qw_test_cia_memo", "DEF")
    try:
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
        op = torch.ops.qw_test_cia_memo.twice.default
        with_op = collect()
        assert op in with_op and op not in before, "the newly registered CIA op"
        assert with_op == ORIGINAL() and stats["computed"] == 2
        # a second op in the same (now known) namespace
        library.define("thrice(Tensor x) -> Tensor")
        library.impl("thrice", lambda x: x * 3, "CompositeImplicitAutograd")
        assert torch.ops.qw_test_cia_memo.thrice.default in collect()
        assert collect() == ORIGINAL() and stats["computed"] == 3
    finally:
        library._destroy()
    after = collect()
    assert op not in after and after == ORIGINAL() and stats["computed"] == 4


def test_patched_where_torch_binds_it_for_the_session_and_restored():
    from torch.export import decomp_utils, exported_program

    session = getattr(exported_program, NAME)
    assert getattr(decomp_utils, NAME) is session and inspect.unwrap(session) is ORIGINAL
    generator = cia_ops_collected_once()  # a second, nested activation
    stats = next(generator)
    assert getattr(exported_program, NAME) is not session
    getattr(exported_program, NAME)()
    assert stats["computed"] + stats["reused"] == 1
    generator.close()
    assert getattr(exported_program, NAME) is session and getattr(decomp_utils, NAME) is session


def test_check_mode_names_a_difference():
    calls = iter([{torch.ops.aten.linear.default}, {torch.ops.aten.matmul.default}])
    collect = memoized(lambda: next(calls), {"computed": 0, "reused": 0}, check=True)
    collect()
    with pytest.raises(AssertionError, match=r"aten\.matmul\.default.*aten\.linear\.default"):
        collect()


# -- programs with and without the memo --------------------------------------------------------------


@pytest.mark.executorch
def test_lowered_programs_are_identical_without_the_memo(monkeypatch, tied_lm_8da4w):
    """The same .pte bytes with torch's own walk as with the memo: a static-quantized Linear +
    Conv2d through quantweave_xnnpack, and the 8da4w tied LM the recipe tests share (conftest.py)
    through quantweave_executorch."""
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e executorch)")
    from torch.export import decomp_utils, exported_program

    import quantweave as qw
    import quantweave_executorch as qe
    import quantweave_xnnpack as qx

    class LinearConv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.linear = torch.nn.Linear(6, 4)

        def forward(self, x):
            return self.linear(self.conv(x))

    x = torch.randn(1, 3, 8, 8)
    prepared = qw.prepare_pt2e(torch.export.export(LinearConv().eval(), (x,)).module(), qx.XNNPACKQuantizer())
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    _, prompts, lm, lm_program = tied_lm_8da4w
    memo = qx.to_executorch(converted, (x,)).buffer
    for module in (utils, exported_program, decomp_utils):
        monkeypatch.setattr(module, NAME, ORIGINAL)
    assert qx.to_executorch(converted, (x,)).buffer == memo
    assert qe.to_executorch(lm, (prompts[:1],)).buffer == lm_program.buffer

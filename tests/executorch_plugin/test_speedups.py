"""The test session's shortcuts for ExecuTorch lowerings (tests/executorch_speedups.py): the memo of
torch's preservable-CIA-op walk returns what torch's function returns and sees an op registered (or
removed) after it was filled; provenance records (``NodeSource``) are shared instead of deep-copied,
with the same provenance on every node; lowered programs are byte-identical with and without both
(marker ``executorch``)."""

import copy
import inspect

import pytest
import torch
from torch._export import utils

from tests.executorch_speedups import DEEPCOPY, NAME, cia_ops_collected_once, memoized, node_sources_shared
from tests.helpers import xnnpack_static_conv_linear

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


def test_node_sources_are_shared_for_the_session_and_restored(monkeypatch):
    from torch.fx.traceback import NodeSource

    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    chain = [NodeSource(None, "outer")]
    chain[0].from_node = [NodeSource(node, "a_pass")]
    copied = copy.deepcopy(chain)
    assert copied is not chain and copied[0] is chain[0], "the list copied, the record shared"
    generator = node_sources_shared()  # nested inside the session's: leaves the session's alone
    next(generator)
    generator.close()
    assert copy.deepcopy(chain)[0] is chain[0]
    monkeypatch.delattr(NodeSource, DEEPCOPY)  # without the session's: torch's deep copy
    plain = copy.deepcopy(chain)
    assert plain[0] is not chain[0] and plain[0].from_node[0] is not chain[0].from_node[0]
    assert plain[0].to_dict() == chain[0].to_dict()
    generator = node_sources_shared()
    next(generator)
    assert copy.deepcopy(chain)[0] is chain[0]
    generator.close()
    assert DEEPCOPY not in vars(NodeSource), "restored"


def _provenance(graph_module):
    """Each node's provenance records as dicts, without ``graph_id`` (an ``id()`` of a graph)."""

    def strip(record):
        return {k: [strip(r) for r in v] if k == "from_node" else v for k, v in record.items() if k != "graph_id"}

    return [(n.name, [strip(r.to_dict()) for r in n.meta.get("from_node", [])]) for n in graph_module.graph.nodes]


# -- programs with and without the memos ------------------------------------------------------------


@pytest.mark.executorch
def test_lowered_programs_are_identical_without_the_memos(monkeypatch, tied_lm_8da4w):
    """The same .pte bytes with torch's own walk and deep copies of provenance records as with the
    memos: a static-quantized Linear + Conv2d through quantweave_xnnpack (and the same provenance on
    every node of its edge program and of each delegate's graph), and the 8da4w tied LM the recipe
    tests share (conftest.py) through quantweave_executorch."""
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e executorch)")
    from torch.export import decomp_utils, exported_program

    import quantweave_executorch as qe
    import quantweave_xnnpack as qx

    _, converted, x = xnnpack_static_conv_linear()
    _, prompts, lm, lm_program = tied_lm_8da4w

    def lower():
        edge, _ = qx.lower_to_edge(converted, (x,))
        gm = edge.exported_program().graph_module
        delegates = [
            getattr(gm, str(n.target)).original_module.graph_module for n in gm.graph.nodes if n.op == "get_attr"
        ]
        return [_provenance(g) for g in (gm, *delegates)], bytes(edge.to_executorch().buffer)

    from torch.fx.traceback import NodeSource

    memo_provenance, memo = lower()
    assert len(memo_provenance) > 1 and any(records for _, records in memo_provenance[0]), "delegates, provenance"
    for module in (utils, exported_program, decomp_utils):
        monkeypatch.setattr(module, NAME, ORIGINAL)
    monkeypatch.delattr(NodeSource, DEEPCOPY)
    from torch.fx import GraphModule

    from tests import _lowering_lazy

    monkeypatch.setattr(GraphModule, "recompile", _lowering_lazy._ORIGINAL_RECOMPILE)  # eager recompiles too
    provenance, plain = lower()
    assert plain == memo
    assert provenance == memo_provenance
    assert qe.to_executorch(lm, (prompts[:1],)).buffer == lm_program.buffer

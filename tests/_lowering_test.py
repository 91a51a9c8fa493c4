"""The test session's deferred GraphModule recompiles (tests/_lowering_lazy.py): nothing generated
inside a window until used, a stale module behaves and reads as an eagerly recompiled one, every stale
module is recompiled when the window closes, GraphModule and ExecuTorch's entry points are restored;
lowered programs are byte-identical with and without it (marker ``executorch``)."""

import contextlib
import copy
import inspect
import pickle

import pytest
import torch
from torch.fx import GraphModule

from tests import _lowering_lazy as lazy
from tests.helpers import count_code_generations, xnnpack_static_conv_linear


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu() + 1


@pytest.fixture
def traced() -> GraphModule:
    return torch.fx.symbolic_trace(_Net())


@pytest.fixture
def installed():
    with lazy.installed() as stats:
        yield stats


def _double_the_relu(gm: GraphModule) -> None:
    """The graph changed in place: y.relu() -> y.relu().mul(2)."""
    relu = next(n for n in gm.graph.nodes if n.target == "relu")
    with gm.graph.inserting_after(relu):
        doubled = gm.graph.call_method("mul", (relu, 2))
    relu.replace_all_uses_with(doubled, delete_user_cb=lambda user: user is not doubled)


def test_nothing_generated_in_a_window_until_used_and_all_done_when_it_closes(installed, traced, monkeypatch):
    eager = GraphModule(traced, copy.deepcopy(traced.graph))
    x = torch.randn(4, 3)
    generated = count_code_generations(monkeypatch)
    with lazy.deferred_recompiles():
        gm = GraphModule(traced, copy.deepcopy(traced.graph))
        gm.recompile()
        gm.graph = gm.graph
        assert generated == [] and lazy.is_stale(gm)
        assert installed["recompiles deferred"] == 3
        assert torch.equal(gm(x), eager(x)), "the first call recompiles"
        assert len(generated) == 1 and not lazy.is_stale(gm)
        _double_the_relu(gm)
        gm.recompile()
        left = GraphModule(traced, copy.deepcopy(gm.graph))
        assert len(generated) == 1
    assert len(generated) == 3 and not lazy.is_stale(gm) and not lazy.is_stale(left), "recompiled at the exit"
    assert installed["recompiles at exit"] == 2
    _double_the_relu(eager)
    eager.recompile()
    assert gm.code == eager.code == left.code
    assert torch.equal(gm(x), eager(x)) and torch.equal(left(x), eager(x))


def test_a_stale_module_reads_as_a_recompiled_one(installed, traced):
    eager = GraphModule(traced, copy.deepcopy(traced.graph))
    _double_the_relu(eager)
    eager.recompile()
    x = torch.randn(4, 3)
    readers = {
        "code": lambda gm: gm.code,
        "str": str,
        "pickle": lambda gm: pickle.loads(pickle.dumps(gm)).code,
        "copy": lambda gm: copy.copy(gm).code,
        "deepcopy": lambda gm: copy.deepcopy(gm).code,
        "recompile's PythonCode": lambda gm: gm.recompile().src,
        "call": lambda gm: gm(x),
        "signature (export names inputs after it)": lambda gm: str(inspect.signature(gm.forward)),
    }
    expected = {name: read(eager) for name, read in readers.items()}
    for name, read in readers.items():
        with lazy.deferred_recompiles():
            gm = GraphModule(traced, copy.deepcopy(traced.graph))
            _double_the_relu(gm)
            gm.recompile()
            assert lazy.is_stale(gm)
            got = read(gm)
        if isinstance(got, torch.Tensor):
            assert torch.equal(got, expected[name]), name
        else:
            assert got == expected[name], name


def test_a_stale_exported_module_has_the_signature_of_its_generated_forward(installed):
    module = torch.export.export(_Net(), (torch.randn(4, 3),)).module()
    eager = str(inspect.signature(module.forward))
    with lazy.deferred_recompiles():
        module.recompile()
        assert lazy.is_stale(module)
        assert str(inspect.signature(module.forward)) == eager == "(x)", "not (*args, **kwargs)"


def test_a_child_graph_module_is_deferred_with_its_parent(installed, traced):
    parent = torch.fx.symbolic_trace(torch.nn.Sequential(_Net()))
    parent.add_submodule("inner", traced)
    with lazy.deferred_recompiles():
        parent.recompile()
        assert lazy.is_stale(parent) and lazy.is_stale(traced)
    assert not lazy.is_stale(parent) and not lazy.is_stale(traced)


def test_outside_a_window_recompiles_are_eager_and_everything_is_restored(traced, monkeypatch):
    members = {name: GraphModule.__dict__[name] for name in ("recompile", "code", *lazy._READERS)}
    generated = count_code_generations(monkeypatch)
    with lazy.installed():
        traced.recompile()
        assert len(generated) == 1 and not lazy.is_stale(traced)
    assert {name: GraphModule.__dict__[name] for name in members} == members


@pytest.mark.executorch
def test_entry_points_open_a_window_and_are_restored():
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e executorch)")
    from executorch import exir
    from executorch.exir.program import _program

    before = (exir.to_edge_transform_and_lower, _program.to_edge, _program.EdgeProgramManager.to_executorch)
    with lazy.installed():
        assert exir.to_edge_transform_and_lower is not before[0]
        assert exir.to_edge_transform_and_lower.__wrapped__ is before[0]
    assert (exir.to_edge_transform_and_lower, _program.to_edge, _program.EdgeProgramManager.to_executorch) == before


@pytest.mark.executorch
def test_lowered_programs_are_identical_with_and_without_deferred_recompiles(monkeypatch):
    """The same .pte bytes with the session's deferred recompiles as with eager ones (GraphModule's
    own ``recompile`` put back): a static-quantized Conv2d + Linear through quantweave_xnnpack, and the
    same model in float. The zoo, tests/xnnpack and tests/executorch_plugin programs were checked the
    same way by ``python -m tests._lowering_check``."""
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e executorch)")
    import quantweave_xnnpack as qx

    model, converted, x = xnnpack_static_conv_linear()
    with contextlib.ExitStack() as stack:
        if GraphModule.__dict__["recompile"] is not lazy._recompile:  # switched off for the session
            stack.enter_context(lazy.installed())
        stats = lazy._state["stats"]
        before = stats["recompiles deferred"]
        deferred = [qx.to_executorch(m, (x,)).buffer for m in (converted, model)]
        assert stats["recompiles deferred"] > before, "the lowerings deferred recompiles"
        monkeypatch.setattr(GraphModule, "recompile", lazy._ORIGINAL_RECOMPILE)
        assert [qx.to_executorch(m, (x,)).buffer for m in (converted, model)] == deferred

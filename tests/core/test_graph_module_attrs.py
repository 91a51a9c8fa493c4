"""``_modules/graph_module_attrs.construct`` builds the GraphModule torch's constructor builds.

Each case builds a module over the same root and graph both ways (``_LazyGraphModule(root,
graph)`` and ``construct(_LazyGraphModule, root, graph)``) and compares their whole attribute
tree: every module's registered parameters, buffers and children (by identity for what was
copied, by class for the containers made), its non-persistent buffer names, its plain attributes,
its training flag, and the GraphModule's tracer and graph.
"""

import pytest
import torch
from torch import nn
from torch.fx import Graph, GraphModule
from torch.fx._lazy_graph_module import _LazyGraphModule

import quantweave as qw
from quantweave._modules.graph_module_attrs import construct
from quantweave.testing.reference import make_reference_quantizer
from tests.helpers import export


def _layout(gm: GraphModule):
    def identity(value):
        return type(value) if type(value) is nn.Module else id(value)  # containers are new either way

    rows = []
    for name, module in gm.named_modules(remove_duplicate=False):
        # plain attributes: copied ones by identity; the GraphModule's own (its meta dict) by class
        plain = {k: id(v) if name else type(v) for k, v in vars(module).items() if not k.startswith("_")}
        rows.append(
            (
                name,
                identity(module) if name else "root",
                module.training,
                [(k, id(v)) for k, v in module._parameters.items()],
                [(k, id(v)) for k, v in module._buffers.items()],
                sorted(module._non_persistent_buffers_set),
                [(k, identity(v)) for k, v in module._modules.items()],
                plain,
            )
        )
    return rows, gm._tracer_cls, gm._tracer_extras, list(gm.state_dict()), gm.graph


def _both(root, graph):
    theirs = _LazyGraphModule(root, graph)
    ours = construct(_LazyGraphModule, root, graph)
    assert ours.graph is graph and ours.graph.owning_module is ours
    return theirs, ours


def _assert_same(root, graph):
    theirs, ours = _both(root, graph)
    assert _layout(ours)[:4] == _layout(theirs)[:4]
    return theirs, ours


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(8), persistent=False)
        self.offset = torch.zeros(8)  # a plain tensor attribute, not registered

    def forward(self, x):
        return self.fc(x) * self.scale + self.offset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x) + self.head.bias


def test_exported_prepared_and_converted_models():
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    exported = export(Net().eval(), x)
    prepared = qw.prepare_pt2e(exported, make_reference_quantizer())
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    for module in (exported, prepared, converted):
        theirs, ours = _assert_same(module, module.graph)
        assert torch.equal(ours(x), theirs(x))


def test_a_traced_model_with_modules_called_and_attributes_read():
    """symbolic_trace calls the leaf modules (``blocks.0.fc``) and reads buffers and plain
    tensors beside them (``blocks.0.scale`` is non-persistent in the model, ``blocks.0.offset``
    not registered: both become persistent buffers, as torch copies them)."""
    traced = torch.fx.symbolic_trace(Net())
    theirs, ours = _assert_same(traced, traced.graph)
    assert "blocks.0.offset" in dict(ours.named_buffers())
    x = torch.randn(3, 8)
    assert torch.equal(ours(x), theirs(x))


def _graph(*steps):
    graph = Graph()
    x = graph.placeholder("x")
    out = x
    for op, target in steps:
        node = graph.get_attr(target) if op == "get_attr" else graph.call_module(target, (x,))
        out = graph.call_function(torch.add, (out, node))
    graph.output(out)
    return graph


def test_a_module_installed_over_a_container_and_a_path_under_it():
    """``a.w`` makes a container ``a``; ``call_module a`` replaces it with the real module; a
    later ``a.b`` is then left alone (torch stops at a parent installed whole)."""
    root = nn.Module()
    root.a = nn.Module()
    root.a.w = nn.Parameter(torch.ones(1))
    root.a.register_buffer("b", torch.ones(1))
    root.a.forward = lambda x: x
    graph = _graph(("get_attr", "a.w"), ("call_module", "a"), ("get_attr", "a.b"), ("get_attr", "a.w"))
    _, ours = _assert_same(root, graph)
    assert ours.a is root.a


def test_the_same_path_twice_and_deep_paths():
    root = nn.Module()
    root.p = nn.Module()
    root.p.q = nn.Module()
    root.p.q.r = nn.Module()
    root.p.q.r.w = nn.Parameter(torch.ones(2))
    root.p.q.v = torch.ones(2)
    root.top = torch.zeros(1)
    graph = _graph(("get_attr", "p.q.r.w"), ("get_attr", "p.q.v"), ("get_attr", "p.q.r.w"), ("get_attr", "top"))
    _assert_same(root, graph)


class Shadowing(nn.Module):
    """A container whose class has its own attribute lookup: copied through getattr / setattr."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def __getattr__(self, name):
        return super().__getattr__(name)


def test_modules_with_their_own_lookup_and_global_registration_hooks():
    root = nn.Module()
    root.s = Shadowing()
    root.s.inner = nn.Module()
    root.s.inner.register_buffer("b", torch.ones(1))
    graph = _graph(("get_attr", "s.w"), ("get_attr", "s.inner.b"))
    _assert_same(root, graph)
    seen = []
    handles = [
        torch.nn.modules.module.register_module_module_registration_hook(lambda *a: seen.append("module")),
        torch.nn.modules.module.register_module_buffer_registration_hook(lambda *a: seen.append("buffer")),
        torch.nn.modules.module.register_module_parameter_registration_hook(lambda *a: seen.append("parameter")),
    ]
    try:
        _LazyGraphModule(root, graph)
        theirs_calls, seen[:] = list(seen), []
        construct(_LazyGraphModule, root, graph)
        assert seen == theirs_calls and "parameter" in seen and "buffer" in seen
        _assert_same(root, graph)
    finally:
        for handle in handles:
            handle.remove()


def test_bad_targets_fail_as_in_torch():
    root = nn.Module()
    root.a = nn.Module()
    for target in ("a.missing", "missing.w"):
        graph = _graph(("get_attr", target))
        with pytest.raises(AttributeError) as theirs:
            _LazyGraphModule(root, graph)
        with pytest.raises(AttributeError) as ours:
            construct(_LazyGraphModule, root, graph)
        assert str(ours.value) == str(theirs.value)


def test_a_deferred_module_of_convert_runs_and_names_its_attributes_as_before():
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    prepared = qw.prepare_pt2e(export(Net().eval(), x), make_reference_quantizer())
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    reference = GraphModule(converted, converted.graph)  # eager, torch's constructor
    assert [n for n, _ in converted.named_buffers()] == [n for n, _ in reference.named_buffers()]
    assert [n for n, _ in converted.named_parameters()] == [n for n, _ in reference.named_parameters()]
    assert torch.equal(converted(x), reference(x))

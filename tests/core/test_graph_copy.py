"""``_modules/graph.add_node`` / ``copy_nodes`` make the nodes torch's ``create_node`` /
``graph_copy`` make, without the scan of arguments for raw SymInts (issue 25).

Each case compares the whole node list both ways: name, op, target, type, args and kwargs (the
copied nodes' positions), meta (the same items in a dict of the copy's own), each node's users and
the generated code.
"""

import operator

import pytest
import torch
from torch.fx import Graph, Node

from quantweave._modules.graph import add_node, copy_graph_module, copy_nodes
from tests.helpers import export


class Mixed(torch.nn.Module):
    """Positional and keyword arguments, nested lists, a constant, a multi-output op."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, b = torch.split(self.linear(x), 4, dim=-1)
        z = torch.cat([a, b * self.scale, y], dim=1)
        return torch.nn.functional.gelu(z, approximate="tanh").sum(dim=-1, keepdim=True), a.max(dim=0).values


def _layout(graph: Graph) -> list[tuple]:
    index = {node: i for i, node in enumerate(graph.nodes)}

    def at(value):
        return torch.fx.node.map_arg(value, lambda n: ("node", index[n]))

    return [
        (
            node.name,
            node.op,
            node.target,
            node.type,
            at(node.args),
            at(node.kwargs),
            sorted(node.meta),
            [id(v) for v in node.meta.values()],
            sorted(index[u] for u in node.users),
        )
        for node in graph.nodes
    ]


@pytest.fixture
def exported():
    return export(Mixed(), torch.randn(2, 8), torch.randn(2, 3))


def test_copy_nodes_makes_the_nodes_graph_copy_makes(exported):
    theirs, ours = Graph(), Graph()
    their_map: dict[Node, Node] = {}
    our_map: dict[Node, Node] = {}
    their_out = theirs.graph_copy(exported.graph, their_map, return_output_node=True)
    our_out = copy_nodes(ours, exported.graph, our_map)
    assert our_out is not None and their_out is not None
    assert _layout(ours) == _layout(theirs)
    assert [our_map[n].name for n in our_map] == [their_map[n].name for n in their_map]
    value, output = our_out
    assert output is exported.graph.output_node()
    assert torch.fx.node.map_arg(value, lambda n: n.name) == torch.fx.node.map_arg(their_out[0], lambda n: n.name)
    for source, copy in our_map.items():  # the copy's own meta dicts, holding the same values
        assert copy.meta == source.meta and copy.meta is not source.meta


def test_copy_nodes_skips_mapped_nodes_and_uses_their_values(exported):
    """As graph_copy: a node already in the map is not copied, its users read the mapped value."""
    first = next(iter(exported.graph.nodes))
    theirs, ours = Graph(), Graph()
    their_stand_in = theirs.placeholder("stand_in")
    our_stand_in = ours.placeholder("stand_in")
    theirs.graph_copy(exported.graph, {first: their_stand_in})
    copy_nodes(ours, exported.graph, {first: our_stand_in})
    assert _layout(ours) == _layout(theirs)


def test_copy_graph_module_runs_as_the_model(exported):
    x, y = torch.randn(2, 8), torch.randn(2, 3)
    copied, node_map = copy_graph_module(exported)
    torch.testing.assert_close(copied(x, y), exported(x, y))
    assert _layout(copied.graph)[:-1] == _layout(exported.graph)[:-1]  # the output's meta is a copy too
    assert set(node_map) == set(exported.graph.nodes)


def test_add_node_makes_the_node_create_node_makes(exported):
    """Same name, position, arguments, users and code, for each op kind and with kwargs."""
    graphs = []
    for make in ("theirs", "ours"):
        graph = Graph()
        x = graph.placeholder("x")
        args: list[tuple] = [
            ("call_function", torch.ops.aten.add.Tensor, (x, x), {"alpha": 2}),
            ("call_function", operator.getitem, (x, 0), None),
            ("call_method", "view", (x, [-1]), None),
            ("call_module", "linear", (x,), None),
            ("get_attr", "scale", (), None),
            ("call_function", torch.ops.aten.cat.default, ([x, x],), {"dim": 0}),
        ]
        made = []
        for op, target, a, k in args:
            if make == "theirs":
                made.append(graph.create_node(op, target, a, k))
            else:
                made.append(add_node(graph, op, target, a, k))
        with graph.inserting_before(made[1]):  # the insert point is kept
            if make == "theirs":
                graph.create_node("call_function", torch.relu, (made[0],), name="early")
            else:
                add_node(graph, "call_function", torch.relu, (made[0],), name="early")
        graph.output(tuple(made))
        graphs.append(graph)
    assert _layout(graphs[1]) == _layout(graphs[0])
    assert graphs[1].python_code("self").src == graphs[0].python_code("self").src

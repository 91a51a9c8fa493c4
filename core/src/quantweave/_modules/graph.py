"""Graph utilities shared by prepare, convert and the graph rewrites."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import map_arg

from ..annotation import (
    ANNOTATION_KEY,
    DerivedQuantizationSpec,
    EdgeOrNode,
    QuantizationAnnotation,
    SharedQuantizationSpec,
)
from .torch_compat import deferred_graph_module, empty_graph_like, lazy_graph_module

# Node.meta keys that follow a tensor when quantize/dequantize nodes are put around it.
PORTED_META_KEYS = ("stack_trace", "nn_module_stack", "source_fn_stack", "quantization_tag")


def check_graph_module(model: object, api: str) -> GraphModule:
    if not isinstance(model, GraphModule):
        raise TypeError(
            f"{api} expects a torch.fx.GraphModule from "
            f"torch.export.export(model, args).module(); got {type(model).__name__}"
        )
    return model


def copy_graph_module(model: GraphModule) -> tuple[GraphModule, dict[Node, Node]]:
    """A new GraphModule over a copy of ``model``'s graph, and the old-to-new node map.

    Tensors (parameters, buffers) and submodules are shared with ``model``, not copied;
    the container modules are new, so ``setattr`` on the copy never reaches ``model``.
    Node meta dicts are shallow-copied, so what is written into them stays on the copy.
    """
    graph = empty_graph_like(model.graph)  # same tracer class and pytree in/out specs
    node_map: dict[Node, Node] = {}
    copied = copy_nodes(graph, model.graph, node_map)
    if copied is not None:
        output_value, old_output = copied
        new_output = graph.output(output_value, type_expr=getattr(old_output, "type", None))
        new_output.meta = copy.copy(old_output.meta)
        node_map[old_output] = new_output
    # work in progress: Python code is generated on first call, not on construction (most
    # working copies are never called; rebuild() makes the module returned to the caller)
    result = lazy_graph_module(model, graph)
    result.meta.update(model.meta)
    # a tensor the graph writes in place (a buffer updated in forward) is the copy's own:
    # running the copy must not change the model it was copied from
    with torch.no_grad():
        for target in sorted(mutated_attrs(graph)):
            value = get_attr_value(result, target)
            if isinstance(value, torch.nn.Parameter):
                set_attr_value(result, target, torch.nn.Parameter(value.detach().clone(), value.requires_grad))
            elif isinstance(value, torch.Tensor):
                set_attr_value(result, target, value.detach().clone())
    return result, node_map


def add_node(
    graph: Graph,
    op: str,
    target: Any,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    type_expr: Any = None,
) -> Node:
    """``graph.create_node(op, target, args, kwargs, name, type_expr)``: the same node at the
    same insert point, without ``create_node``'s scan of the arguments for raw SymInt /
    SymFloat / SymBool values. That scan is a pytree walk of every argument, there to warn
    whoever wrote a graph by hand; the arguments given here are nodes and constants this
    package copies from a graph or makes, and the walk was 40 % of copying a graph (issue 25).
    The node is made without arguments, then given them through ``Node.args`` /
    ``Node.kwargs``, which record its inputs' users as ``create_node`` does."""
    node = graph.create_node(op, target, None, None, name, type_expr)
    if args:
        node.args = args
    if kwargs:
        node.kwargs = kwargs
    return node


def copy_nodes(graph: Graph, source: Graph, node_map: dict[Node, Node]) -> tuple[Any, Node] | None:
    """``graph.graph_copy(source, node_map, return_output_node=True)``, its nodes made by
    :func:`add_node`: every node of ``source`` up to its output that ``node_map`` does not
    already map is copied into ``graph`` (name, op, target, type and a shallow copy of its meta;
    its arguments mapped through ``node_map``) and recorded in ``node_map``. Returns the output
    node's value mapped, and that node; None for a graph without an output."""
    lookup = node_map.__getitem__
    for node in source.nodes:
        if node in node_map:
            continue
        if node.op == "output":
            return map_arg(node.args[0], lookup), node
        new = add_node(
            graph, node.op, node.target, map_arg(node.args, lookup), map_arg(node.kwargs, lookup), node.name, node.type
        )
        new.meta.update(node.meta)  # its own dict, as copy.copy(node.meta) gives (without Node.__setattr__)
        node_map[node] = new
    return None


def mutated_attrs(graph: Graph) -> set[str]:
    """Targets of the ``get_attr`` nodes whose tensors ``graph`` writes in place, directly or
    through a view (``buffer.add_(1)``, ``buffer[0].copy_(x)``)."""
    targets: set[str] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        positions = _written_arguments(node.target)
        if positions is None:
            continue
        written = [node.args[i] if i < len(node.args) else node.kwargs.get(name) for i, name in positions]
        if node.target == torch.ops.aten.batch_norm.default and len(node.args) > 5 and node.args[5] is True:
            written += node.args[3:5]  # training batch norm updates its running statistics (unannotated)
        for value in written:
            pending = list(iter_input_nodes(value))
            while pending:
                base = pending.pop()
                if base.op == "get_attr":
                    targets.add(str(base.target))
                    continue
                base_schema = getattr(base.target, "_schema", None) if base.op == "call_function" else None
                returns = getattr(base_schema, "returns", None)
                if returns and returns[0].alias_info is not None and base.args:  # a view of its first input
                    pending.extend(iter_input_nodes(base.args[0]))
    return targets


#: op -> (position, name) of the arguments its schema writes (read once per op, not per node)
_WRITTEN_ARGUMENTS: dict[Any, tuple[tuple[int, str], ...]] = {}


def _written_arguments(target: Any) -> tuple[tuple[int, str], ...] | None:
    """(position, name) of each argument ``target``'s schema marks as written (``Tensor(a!)``);
    None for a target without a schema (not an op)."""
    try:
        return _WRITTEN_ARGUMENTS[target]
    except (KeyError, TypeError):  # not seen yet, or unhashable
        pass
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    positions = tuple(
        (i, argument.name)
        for i, argument in enumerate(schema.arguments)
        if argument.alias_info is not None and argument.alias_info.is_write
    )
    with contextlib.suppress(TypeError):  # an unhashable target: its schema is read every time
        _WRITTEN_ARGUMENTS[target] = positions
    return positions


def rebuild(model: GraphModule, signature_from: torch.nn.Module | None = None, *, lint: bool = True) -> GraphModule:
    """A fresh GraphModule holding only the attributes the graph uses: eager, or with
    ``signature_from`` (the module the graph was copied from) one whose code is generated on
    first use (``torch_compat.deferred_graph_module``: a prepared model that is never called,
    as an 8da4w one converted straight away, never pays for its code).

    ``lint``: check the graph first (``Graph.lint``: every argument defined before use, every
    target present), where code that is not ours edited it (a quantizer's transform, an
    observer's convert hook); ``False`` where only this package's rewrites did."""
    if lint:
        model.graph.lint()
    if signature_from is None:
        fresh = GraphModule(model, model.graph)
    else:
        fresh = deferred_graph_module(model, model.graph, signature_from)
    fresh.meta.update(model.meta)
    return fresh


def new_attr_name(model: torch.nn.Module, prefix: str, taken_below: dict[str, int] | None = None) -> str:
    """``prefix`` + the smallest index >= 0 that names no attribute of ``model``.

    ``taken_below`` (a caller's memo, per prefix): every index below the one recorded is known
    to be taken, so the search starts there and the memo records the index returned (+ 1) --
    the caller registers the name before asking again and removes none of them (a convert
    naming one frozen weight after another: linear, not quadratic, in the number of weights)."""
    i = 0 if taken_below is None else taken_below.get(prefix, 0)
    while hasattr(model, f"{prefix}{i}"):
        i += 1
    if taken_below is not None:
        taken_below[prefix] = i + 1
    return f"{prefix}{i}"


def get_attr_value(model: torch.nn.Module, target: str) -> Any:
    value: Any = model
    for atom in target.split("."):
        value = getattr(value, atom)
    return value


def set_attr_value(model: torch.nn.Module, target: str, value: Any) -> None:
    *path, name = target.split(".")
    owner: Any = model
    for atom in path:
        owner = getattr(owner, atom)
    setattr(owner, name, value)


def is_constant(node: Node, cache: dict[Node, bool]) -> bool:
    """True if ``node`` computes from get_attr nodes and literals only (a weight transform)."""
    if node in cache:
        return cache[node]
    if node.op == "get_attr":
        result = True
    elif node.op == "call_function":
        # inputs first: an activation's chain ends at a placeholder (False) without each node on
        # it asked whether it is impure (torch's look-up of the op's schema, the slower test)
        result = all(is_constant(arg, cache) for arg in node.all_input_nodes) and not _is_impure(node)
    else:
        result = False
    cache[node] = result
    return result


def _is_impure(node: Node) -> bool:
    try:
        return bool(node.is_impure())
    except Exception:  # pragma: no cover - defensive: unknown targets count as impure
        return True


def evaluate_constant(model: GraphModule, node: Node, memo: dict[Node, Any]) -> Any:
    """Compute the value of a constant node (see :func:`is_constant`)."""
    if node in memo:
        return memo[node]
    if node.op == "get_attr":
        value = get_attr_value(model, str(node.target))
    else:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: evaluate_constant(model, n, memo))
        assert callable(node.target)
        value = node.target(*args, **kwargs)
    memo[node] = value
    return value


def iter_input_nodes(arg: Any) -> Iterator[Node]:
    """The nodes in an argument, looking inside lists and tuples (as for cat)."""
    if isinstance(arg, Node):
        yield arg
    elif isinstance(arg, (list, tuple)):
        for item in arg:
            yield from iter_input_nodes(item)


def port_meta(source: Node, target: Node, keys: Iterable[str] = PORTED_META_KEYS) -> None:
    for key in keys:
        if key in source.meta:
            target.meta[key] = source.meta[key]


def erase_dead(graph: Graph, roots: Iterable[Node]) -> int:
    """Erase the nodes of ``roots`` that have no users, then their inputs left without
    users, and so on. Only ``get_attr`` and pure ``call_function`` nodes are erased
    (placeholders, outputs, modules and in-place updates stay). Returns how many."""
    pending = list(roots)
    erased: set[Node] = set()
    while pending:
        node = pending.pop()
        if node in erased or node.users or node.op not in ("get_attr", "call_function"):
            continue
        if node.op == "call_function" and _is_impure(node):
            continue
        inputs = node.all_input_nodes
        graph.erase_node(node)
        erased.add(node)
        pending.extend(inputs)
    return len(erased)


def remap_annotations(
    graph: Graph,
    node_map: Mapping[Node, Node] | None = None,
    edge_map: Mapping[tuple[Node, Node], Node] | None = None,
    *,
    drop_unquantized_non_inputs: bool = False,
) -> None:
    """Give every annotated node of ``graph`` a new annotation whose keys and specs name
    the current nodes and edges.

    ``node_map`` renames nodes (e.g. old graph -> copy); ``edge_map`` then gives an input
    edge ``(producer, consumer)`` a new producer (a rewrite inserted a node on it). Keys of
    ``input_qspec_map`` and the references of shared and derived specs are remapped alike.
    Annotations and specs are rebuilt with :func:`dataclasses.replace`, so subclasses and
    their extra fields survive; other specs are kept as they are. With
    ``drop_unquantized_non_inputs``, ``None`` entries naming a node that is no longer an
    input (a rewrite removed the edge) are dropped.
    """
    nodes: Mapping[Node, Node] = node_map or {}
    edges: Mapping[tuple[Node, Node], Node] = edge_map or {}

    def source(producer: Node, consumer: Node) -> Node:
        producer, consumer = nodes.get(producer, producer), nodes.get(consumer, consumer)
        return edges.get((producer, consumer), producer)

    def key(k: EdgeOrNode) -> EdgeOrNode:
        if isinstance(k, Node):
            return nodes.get(k, k)
        return (source(*k), nodes.get(k[1], k[1]))

    def spec(value: Any) -> Any:
        if isinstance(value, SharedQuantizationSpec):
            return dataclasses.replace(value, edge_or_node=key(value.edge_or_node))
        if isinstance(value, DerivedQuantizationSpec):
            return dataclasses.replace(value, derived_from=[key(k) for k in value.derived_from])
        return value

    for node in graph.nodes:
        annotation = node.meta.get(ANNOTATION_KEY)
        if not isinstance(annotation, QuantizationAnnotation):
            continue
        input_map: dict[Node, Any] = {}
        for producer, value in annotation.input_qspec_map.items():
            new_producer = source(producer, node)
            if drop_unquantized_non_inputs and value is None and new_producer not in node.all_input_nodes:
                continue
            input_map[new_producer] = spec(value)
        node.meta[ANNOTATION_KEY] = dataclasses.replace(
            annotation, input_qspec_map=input_map, output_qspec=spec(annotation.output_qspec)
        )

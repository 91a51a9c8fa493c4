"""Graph utilities shared by prepare and convert."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch.fx import Graph, GraphModule, Node

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
    graph = Graph(tracer_cls=model.graph._tracer_cls)
    node_map: dict[Node, Node] = {}
    copied = graph.graph_copy(model.graph, node_map, return_output_node=True)
    graph._codegen = model.graph._codegen  # pytree specs: immutable, shared
    if copied is not None:
        output_value, old_output = cast(tuple[Any, Node], copied)
        new_output = graph.output(output_value, type_expr=getattr(old_output, "type", None))
        new_output.meta = copy.copy(old_output.meta)
        node_map[old_output] = new_output
    result = _working_module(model, graph)
    result.meta.update(model.meta)
    return result, node_map


def _working_module(root: torch.nn.Module, graph: Graph) -> GraphModule:
    """A GraphModule for work in progress: its Python code is generated on first call, not
    on construction (most working copies are never called; :func:`rebuild` makes the final,
    eagerly compiled module)."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # pragma: no cover - older/newer torch without it: compile eagerly
        return GraphModule(root, graph)
    return _LazyGraphModule(root, graph)


def rebuild(model: GraphModule) -> GraphModule:
    """Compile into a fresh (eager) GraphModule holding only the attributes the graph uses."""
    model.graph.lint()
    fresh = GraphModule(model, model.graph)
    fresh.meta.update(model.meta)
    return fresh


def new_attr_name(model: torch.nn.Module, prefix: str) -> str:
    i = 0
    while hasattr(model, f"{prefix}{i}"):
        i += 1
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
    elif node.op == "call_function" and not _is_impure(node):
        result = all(is_constant(arg, cache) for arg in node.all_input_nodes)
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


def port_meta(source: Node, target: Node) -> None:
    for key in PORTED_META_KEYS:
        if key in source.meta:
            target.meta[key] = source.meta[key]

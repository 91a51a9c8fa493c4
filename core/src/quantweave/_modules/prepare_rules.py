"""Prepare-time rules that make ``prepare_pt2e`` behave as PT2E users expect (torchao 0.18's
behaviour where it is right), kept out of ``prepare.py`` so that module stays the flow:

- :func:`drop_in_place_destinations` -- no observer between a buffer and the in-place op that
  writes it (``buf.index_put_(...)``, ``buf.copy_(x)``): the op must write the buffer itself,
  not an observed copy of it (the write would be lost, and convert could fold the buffer);
- :func:`map_subgraphs` -- the bodies of ``scan`` (``combine_fn``) and ``while_loop``
  (``body_fn``) are separate graph modules: prepare and convert recurse into them with the
  same quantizer (as torchao does); any other control-flow subgraph (``torch.cond``'s
  branches...) is left float with a warning naming it, never silently.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Node

from ..annotation import EdgeOrNode
from .graph import get_attr_value

__all__ = ["SUBGRAPH_ARGUMENTS", "drop_in_place_destinations", "map_subgraphs", "writes_first_input"]


def _subgraph_arguments() -> dict[Any, tuple[int, ...]]:
    higher_order = torch.ops.higher_order
    table: dict[Any, tuple[int, ...]] = {}
    for name, positions in (("scan", (0,)), ("while_loop", (1,))):
        op = getattr(higher_order, name, None)
        if op is not None:
            table[op] = positions
    return table


#: higher-order op -> positions of the subgraph arguments prepare / convert recurse into
SUBGRAPH_ARGUMENTS = _subgraph_arguments()


def map_subgraphs(gm: GraphModule, api: str, transform: Callable[[GraphModule], GraphModule], warn: bool = True) -> int:
    """Replace, on ``gm``, each scan / while_loop body by ``transform(body)`` (once per body,
    however many nodes call it); warn, naming them, about the control-flow subgraphs left as
    they are. ``gm`` is the working copy (its top-level attributes are its own). Returns how
    many bodies were transformed."""
    done: set[str] = set()
    left: dict[str, str] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.HigherOrderOperator):
            continue
        handled = SUBGRAPH_ARGUMENTS.get(node.target, ())
        for index, arg in enumerate(node.args):
            if not (isinstance(arg, Node) and arg.op == "get_attr"):
                continue
            target = str(arg.target)
            body = get_attr_value(gm, target)
            if not isinstance(body, GraphModule) or target in done:
                continue
            if index in handled and "." not in target:
                setattr(gm, target, transform(body))
                done.add(target)
            elif _has_compute(body):
                left.setdefault(target, f"{node.name!r} ({node.target.name()})")
    for target, owner in left.items():
        if warn and target not in done:
            warnings.warn(
                f"{api}: subgraph {target!r} of {owner} is not quantized -- its ops stay float "
                "(quantweave recurses into the bodies of scan and while_loop only)",
                UserWarning,
                stacklevel=3,
            )
    return len(done)


def _has_compute(body: GraphModule) -> bool:
    return any(n.op == "call_function" for n in body.graph.nodes)


def writes_first_input(node: Node) -> bool:
    """True when ``node`` is an op whose schema says it writes its first argument in place."""
    if node.op != "call_function" or not node.args:
        return False
    schema = getattr(node.target, "_schema", None)
    arguments = getattr(schema, "arguments", None)
    if not arguments:
        return False
    alias = arguments[0].alias_info
    return alias is not None and bool(alias.is_write)


def _from_attributes_only(node: Node) -> bool:
    """True when ``node`` is computed from ``get_attr`` nodes (and literals) alone -- a buffer or
    a view of one -- and from no graph input."""
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op == "placeholder":
            return False
        if current.op != "get_attr":
            pending.extend(current.all_input_nodes)
    return True


def drop_in_place_destinations(observers: dict[EdgeOrNode, Any]) -> dict[EdgeOrNode, Any]:
    """``observers`` without the input edges that are the destination of an in-place op on a
    buffer (the edge ``(buffer, op)`` where ``op`` writes its first argument). The op's other
    edges and its output keep their observers (and so the qparams they share)."""
    return {
        key: observer
        for key, observer in observers.items()
        if not (
            isinstance(key, tuple)
            and writes_first_input(key[1])
            and key[1].args[0] is key[0]
            and _from_attributes_only(key[0])
        )
    }

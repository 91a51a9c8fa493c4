"""Prepare-time rules that make ``prepare_pt2e`` behave as PT2E users expect (torchao 0.18's
behaviour where it is right), kept out of ``prepare.py`` so that module stays the flow:

- :func:`drop_in_place_destinations` -- no observer between a buffer and the in-place op that
  writes it (``buf.index_put_(...)``, ``buf.copy_(x)``): the op must write the buffer itself,
  not an observed copy of it (the write would be lost, and convert could fold the buffer).
"""

from __future__ import annotations

from typing import Any

from torch.fx import Node

from ..annotation import EdgeOrNode

__all__ = ["drop_in_place_destinations", "writes_first_input"]


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

"""Patterns as chains of ops, matched on an exported graph.

A pattern's ops (``PatternSpec.ops``) are read as a chain of steps: the first op is the
anchor, each next op consumes the previous one's output. Two ops listed one after the
other that export as either form of one step (``relu6`` exports as ``relu6`` or as
``hardtanh``) are one step with two alternatives. Used by the conformance kit (which
annotated node is covered by which declared pattern, which edges are inside a fused unit)
and by ``ComposableQuantizer.capability_table`` (which member's pattern claims which step).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from torch.fx import Graph, Node

__all__ = ["Chain", "chain_of", "embeddings", "matches"]

#: ops one step may export as (a pattern lists both, in this order)
_ALTERNATIVES = {("aten.relu6.default", "aten.hardtanh.default")}

Chain = tuple[frozenset[str], ...]


def chain_of(ops: Sequence[str]) -> Chain:
    """The steps of a pattern whose ops are ``ops`` (anchor first)."""
    steps: list[frozenset[str]] = []
    i = 0
    while i < len(ops):
        if i + 1 < len(ops) and (ops[i], ops[i + 1]) in _ALTERNATIVES:
            steps.append(frozenset(ops[i : i + 2]))
            i += 2
        else:
            steps.append(frozenset((ops[i],)))
            i += 1
    return tuple(steps)


def matches(graph: Graph, chain: Chain) -> list[tuple[Node, ...]]:
    """Every occurrence of ``chain`` in ``graph``: node tuples, one node per step, each
    node a user of the one before."""
    found: list[tuple[Node, ...]] = []

    def extend(path: tuple[Node, ...]) -> None:
        if len(path) == len(chain):
            found.append(path)
            return
        for user in path[-1].users:
            if user.op == "call_function" and str(user.target) in chain[len(path)]:
                extend((*path, user))

    for node in graph.nodes:
        if node.op == "call_function" and str(node.target) in chain[0]:
            extend((node,))
    return found


def embeddings(inner: Chain, outer: Chain) -> Iterable[int]:
    """Offsets at which ``inner`` fits inside ``outer`` step by step (each inner step shares
    an op with the outer step it lands on)."""
    for offset in range(len(outer) - len(inner) + 1):
        if all(step & outer[offset + i] for i, step in enumerate(inner)):
            yield offset

"""Patterns as chains of ops, matched on an exported graph.

A pattern's ops (``PatternSpec.ops``) are read as a chain of steps: the first op is the
anchor, each next op consumes the previous one's output. Two ops listed one after the
other that export as either form of one step (``relu6`` exports as ``relu6`` or as
``hardtanh``) are one step with two alternatives. Used by the conformance kit (which
annotated node is covered by which declared pattern, which edges are inside a fused unit)
and by ``ComposableQuantizer.capability_table`` (which member's pattern claims which step).

A graph node counts as the vocabulary op it computes (:func:`vocabulary_op`): an in-place op
(``aten.relu_.default``, ``aten.add_.Tensor``, from ``F.relu(x, inplace=True)``,
``nn.ReLU(inplace=True)`` or ``x += y``) as its functional op, and a convolution with a
string padding (``aten.conv2d.padding``, from ``padding="same"`` / ``"valid"``) as the
convolution. Patterns name the functional ops only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from torch.fx import Graph, Node

__all__ = ["Chain", "chain_of", "embeddings", "matches", "node_op", "vocabulary_op"]

#: ops one step may export as (a pattern lists both, in this order)
_ALTERNATIVES = {("aten.relu6.default", "aten.hardtanh.default")}

Chain = tuple[frozenset[str], ...]

#: overloads that compute what another op of the vocabulary computes: a convolution whose
#: padding is a string ("same" / "valid") is that convolution
_SAME_AS = {
    "aten.conv1d.padding": "aten.conv1d.default",
    "aten.conv2d.padding": "aten.conv2d.default",
    "aten.conv3d.padding": "aten.conv3d.default",
}


def vocabulary_op(op: str) -> str:
    """The op name the pattern vocabulary knows ``op`` as: ``"aten.relu_.default"`` ->
    ``"aten.relu.default"`` (an aten in-place op counts as its functional op),
    ``"aten.conv2d.padding"`` -> ``"aten.conv2d.default"``; any other name unchanged."""
    op = _SAME_AS.get(op, op)
    namespace, _, rest = op.partition(".")
    name, _, overload = rest.partition(".")
    if namespace == "aten" and overload and len(name) > 1 and name.endswith("_") and not name.startswith("_"):
        return f"aten.{name[:-1]}.{overload}"
    return op


def node_op(node: Node) -> str:
    """The vocabulary op a ``call_function`` node computes (:func:`vocabulary_op` of its target)."""
    return vocabulary_op(str(node.target))


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


def matches(
    graph: Graph, chain: Chain, users: Callable[[Node], Iterable[Node]] | None = None
) -> list[tuple[Node, ...]]:
    """Every occurrence of ``chain`` in ``graph``: node tuples, one node per step, each
    node a user of the one before (a node matches a step by :func:`node_op`: in place or
    with a string padding, as the op it computes). ``users`` says who reads a node (default
    its FX users; the annotation report looks through observers)."""
    found: list[tuple[Node, ...]] = []
    readers = users if users is not None else (lambda node: node.users)

    def extend(path: tuple[Node, ...]) -> None:
        if len(path) == len(chain):
            found.append(path)
            return
        for user in readers(path[-1]):
            if user.op == "call_function" and node_op(user) in chain[len(path)]:
                extend((*path, user))

    for node in graph.nodes:
        if node.op == "call_function" and node_op(node) in chain[0]:
            extend((node,))
    return found


def embeddings(inner: Chain, outer: Chain) -> Iterable[int]:
    """Offsets at which ``inner`` fits inside ``outer`` step by step (each inner step shares
    an op with the outer step it lands on)."""
    for offset in range(len(outer) - len(inner) + 1):
        if all(step & outer[offset + i] for i, step in enumerate(inner)):
            yield offset

"""Why nodes stay float: skip reasons written through the public protocol."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from torch.fx import GraphModule, Node

from ..annotation import (
    ANNOTATION_KEY,
    SKIP_REASON_KEY,
    QuantizationAnnotation,
    is_annotated,
    mark_annotated,
    set_skip_reason,
)
from .graph import node_op, op_name

__all__ = ["explain_float", "has_skip_reason", "in_place_reason", "mark_float"]


def has_skip_reason(node: Node) -> bool:
    """True when some quantizer already recorded why ``node`` stays float."""
    return isinstance(node.meta.get(SKIP_REASON_KEY), str)


def mark_float(
    nodes: Node | Sequence[Node],
    reason: str,
    annotation: Callable[[], QuantizationAnnotation] = QuantizationAnnotation,
    by: str | None = None,
) -> None:
    """Claim ``nodes`` as float: an empty annotation (``annotation()``), marked annotated
    (so later stages and composed quantizers leave them alone), with ``reason`` recorded."""
    for node in [nodes] if isinstance(nodes, Node) else list(nodes):
        node.meta[ANNOTATION_KEY] = annotation()
        mark_annotated(node, by=by)
        set_skip_reason(node, reason)


def explain_float(model: GraphModule, ops: Collection[str], why: Callable[[Node], str | None]) -> int:
    """Record ``why(node)`` on every node of ``model`` that calls one of ``ops`` (vocabulary
    op names, :func:`~quantweave.authoring.node_op`), is not annotated and has no reason yet
    (a reason an earlier member of a composition recorded is kept). ``why`` returning None
    records nothing. Returns how many reasons were recorded."""
    wanted = frozenset(ops)
    count = 0
    explained: dict[Any, bool] = {}  # target -> whether its op is one of ops (node_op reads only the target)
    for node in model.graph.nodes:
        if node.op != "call_function" or is_annotated(node) or has_skip_reason(node):
            continue
        try:
            hit = explained[node.target]
        except KeyError:
            hit = explained[node.target] = node_op(node) in wanted
        except TypeError:  # an unhashable target
            hit = node_op(node) in wanted
        if not hit:
            continue
        reason = why(node)
        if reason is not None:
            set_skip_reason(node, reason)
            count += 1
    return count


def in_place_reason(node: Node, quantizer: str) -> str | None:
    """The reason for an in-place op (``x += y``) a quantizer matches only as its functional
    op, or None when ``node`` is not in place. ``prepare_pt2e`` annotates an in-place op whose
    write nobody else sees as its functional op; one left in place writes a tensor that
    something else reads (a view of it, a model input, a parameter or buffer)."""
    functional = node_op(node)
    parts = str(node.target).split(".")
    if functional == str(node.target) or len(parts) != 3 or not parts[1].endswith("_"):
        return None
    name = functional.split(".")[1]
    return (
        f"{op_name(node)} is in place: {quantizer} quantizes {name} only as the functional op "
        f"({functional}), and this write is seen elsewhere (through a view, or on a model input, parameter "
        "or buffer), so it stays in place; write it out of place (x = x + y, not x += y) to have it quantized"
    )

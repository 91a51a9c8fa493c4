"""In-place ops as their functional forms, on the working copy ``prepare_pt2e`` annotates.

``torch.export`` keeps in-place ops: ``out += identity`` exports as ``aten.add_.Tensor``,
``nn.ReLU(inplace=True)`` as ``aten.relu_.default``. Quantizers match the functional ops
(``aten.add.Tensor``), so before annotation :func:`functionalize_in_place` rewrites each
in-place op whose write nobody else can see into its functional op (same node, same name,
same metadata; the caller's graph is a different graph and is left as it was).

A write is invisible, and the rewrite exact, when the written tensor:

- is computed by the graph (not an input, a parameter or a buffer: writing those is what
  the program does to its caller's tensors);
- aliases nothing (its producer returns a fresh tensor, not a view or an in-place result
  left in place);
- has no view taken of it before the write (the view would see the new value).

Readers of the written tensor after the in-place op then read the op's result instead,
which is the value they saw before.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.fx import GraphModule, Node

from ..annotation import SKIP_REASON_KEY, is_annotated, set_skip_reason

__all__ = ["explain_left_in_place", "functional_overload", "functionalize_in_place"]


def _schema(node: Node) -> Any:
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def _returns_alias(node: Node) -> bool:
    """True when ``node``'s output may alias one of its inputs (a view, an in-place result)."""
    if node.op != "call_function":
        return True
    schema = _schema(node)
    if schema is None:
        return True  # a Python callable (getitem, operator.*): unknown, assume it may
    return any(ret.alias_info is not None for ret in schema.returns)


#: op -> its functional overload or None (an op's schema never changes: read once per op, not once
#: per node; prepare asks twice per node)
_FUNCTIONAL: dict[Any, Any] = {}
_UNSEEN = object()


def functional_overload(target: Any) -> Any | None:
    """The functional aten overload of an in-place aten op that writes only its first
    argument (``aten.add_.Tensor`` -> ``aten.add.Tensor``), or None."""
    try:
        cached = _FUNCTIONAL.get(target, _UNSEEN)
    except TypeError:  # unhashable
        cached = _UNSEEN
    if cached is not _UNSEEN:
        return cached
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None  # not an op (getitem, a Python callable): nothing kept for it
    overload = _functional_overload(schema)
    with contextlib.suppress(TypeError):  # an unhashable target: its schema is read every time
        _FUNCTIONAL[target] = overload
    return overload


def _functional_overload(schema: Any) -> Any | None:
    if not schema.name.startswith("aten::") or not schema.arguments:
        return None
    name = schema.name.split("::", 1)[1]
    if not name.endswith("_") or name.startswith("_"):
        return None
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(written) != 1 or written[0] is not schema.arguments[0]:
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    overload = getattr(packet, schema.overload_name or "default", None)
    functional = getattr(overload, "_schema", None)
    if functional is None:
        return None
    same_arguments = [(a.name, str(a.type)) for a in functional.arguments] == [
        (a.name, str(a.type)) for a in schema.arguments
    ]
    if not same_arguments or len(functional.returns) != 1 or functional.returns[0].alias_info is not None:
        return None
    return overload


def functionalize_in_place(gm: GraphModule) -> int:
    """Rewrite, in graph order, each in-place op of ``gm`` whose write nobody else sees into
    its functional op (see the module docstring). Returns how many were rewritten."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not node.args or not isinstance(node.args[0], Node):
            continue
        functional = functional_overload(node.target)
        if functional is None:
            continue
        written = node.args[0]
        if _returns_alias(written):
            continue  # an input, a parameter / buffer, a view: the write reaches another tensor
        here = order[node]
        others = [user for user in written.users if user is not node]
        if any(order[user] < here and _returns_alias(user) for user in others):
            continue  # a view taken before the write sees it
        node.target = functional
        for user in others:
            if order[user] > here:
                user.replace_input_with(written, node)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def explain_left_in_place(gm: GraphModule) -> int:
    """After annotation: record why each in-place op that :func:`functionalize_in_place` left
    in place (its write is seen elsewhere) stays float, where no quantizer annotated it or gave
    a reason (a quantizer that matches only functional ops never sees it). Returns how many."""
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or is_annotated(node) or isinstance(node.meta.get(SKIP_REASON_KEY), str):
            continue
        functional = functional_overload(node.target)
        if functional is None:
            continue
        written = node.args[0] if node.args else None
        what = f"'{written.name}'" if isinstance(written, Node) else "its first argument"
        set_skip_reason(
            node,
            f"{node.target} stays in place: it writes {what}, which is seen elsewhere (a model input, a "
            f"parameter or buffer, or a view of it), so it is not rewritten as {functional} and no quantizer "
            "matched it; write it out of place (x = x + y, not x += y) to have it quantized",
        )
        count += 1
    return count

"""Node and graph helpers every backend needs: op matching, get_attr values, copy-then-rewrite."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import torch
from torch.fx import GraphModule, Node

from .._modules.graph import copy_graph_module, get_attr_value, rebuild
from .._modules.patterns import vocabulary_op
from .._modules.working_copy import is_working_copy

__all__ = [
    "attr_value",
    "calls",
    "copy_for_rewrite",
    "describe_node",
    "finish_rewrite",
    "first_user",
    "is_float_tensor",
    "module_attr",
    "node_op",
    "only_user",
    "op_matches",
    "op_name",
    "tensor_value",
]


def op_matches(operator: Any, target: Any) -> bool:
    """True when ``target`` (a node's target) is ``operator``: an ``OpOverload``
    (``aten.add.Tensor``) matches itself, an ``OpOverloadPacket`` (``aten.add``) any of its
    overloads."""
    if isinstance(operator, torch._ops.OpOverloadPacket):
        return getattr(target, "overloadpacket", None) is operator
    return bool(target == operator)


def calls(node: Any, ops: Collection[Any] | Any) -> bool:
    """True when ``node`` is a ``call_function`` node of one of ``ops`` (overloads or packets)."""
    if not isinstance(node, Node) or node.op != "call_function":
        return False
    target = node.target
    if type(ops) is frozenset and type(target) is _OpOverload:
        split = _split_ops(ops)
        if split is not None:  # ops and target compare by identity: two set lookups do what the loop does
            return target in split[0] or target.overloadpacket in split[1]
    choices = ops if isinstance(ops, (tuple, list, set, frozenset)) else (ops,)
    packet = getattr(target, "overloadpacket", None)  # op_matches' test, the target's side read once
    for op in choices:
        if isinstance(op, torch._ops.OpOverloadPacket):
            if packet is op:
                return True
        elif op is target or bool(target == op):
            return True
    return False


_OpOverload = torch._ops.OpOverload
#: frozenset of ops -> (its overloads, its packets); None when it holds anything else
_SPLITS: dict[frozenset[Any], tuple[frozenset[Any], frozenset[Any]] | None] = {}


def _split_ops(ops: frozenset[Any]) -> tuple[frozenset[Any], frozenset[Any]] | None:
    try:
        return _SPLITS[ops]
    except KeyError:
        pass
    split: tuple[frozenset[Any], frozenset[Any]] | None = None
    if all(type(op) in (_OpOverload, torch._ops.OpOverloadPacket) for op in ops):
        split = (
            frozenset(op for op in ops if type(op) is _OpOverload),
            frozenset(op for op in ops if type(op) is torch._ops.OpOverloadPacket),
        )
    if len(_SPLITS) < 1024:  # op sets are few (module constants); a caller making new ones each call only reuses
        _SPLITS[ops] = split
    return split


def node_op(node: Node) -> str:
    """The vocabulary op name of ``node``: ``"aten.relu.default"`` for ``relu_`` too (an
    in-place op counts as its functional op; a string-padding conv as its ``.default``)."""
    return vocabulary_op(str(node.target))


def op_name(node: Node) -> str:
    """The short name of a node's op, for messages: ``"conv2d"`` for ``aten.conv2d.default``."""
    parts = str(node.target).split(".")
    return parts[1] if len(parts) == 3 else str(node.target)


def describe_node(node: Node) -> str:
    """A node as a message names it: ``"relu_3 (relu)"``, or ``"sigmoid"`` when the node is
    named after its op; ``"x (placeholder)"`` for a node that is not a call."""
    if node.op != "call_function":
        return f"{node.name} ({node.op})"
    short = op_name(node)
    return node.name if node.name == short else f"{node.name} ({short})"


def only_user(node: Node) -> Node | None:
    """``node``'s single user, or None when it has none or several."""
    return next(iter(node.users)) if len(node.users) == 1 else None


def first_user(node: Node, ops: Iterable[Any]) -> Node | None:
    """The first user of ``node`` (in use order) that calls one of ``ops``."""
    choices = tuple(ops)
    return next((u for u in node.users if calls(u, choices)), None)


def tensor_value(arg: Any) -> torch.Tensor | None:
    """The (fake) tensor export recorded for ``arg`` (``node.meta["val"]``), or None."""
    val = arg.meta.get("val") if isinstance(arg, Node) else None
    return val if isinstance(val, torch.Tensor) else None


def is_float_tensor(arg: Any, dtypes: Collection[torch.dtype] = (torch.float32,)) -> bool:
    """True when ``arg`` is a graph node whose recorded value is a tensor of one of ``dtypes``
    (float32 by default: ``quantize_per_tensor`` rejects float64, fused fake-quantizers
    reject float16 / bfloat16)."""
    val = tensor_value(arg)
    return val is not None and val.dtype in dtypes


def module_attr(module: torch.nn.Module, target: str) -> Any:
    """``module``'s attribute at the dotted path ``target`` (``"layers.0.weight"``).
    Raises :class:`AttributeError` naming the path when it is missing."""
    try:
        return get_attr_value(module, target)
    except AttributeError:
        raise AttributeError(f"{type(module).__name__} has no attribute {target!r}") from None


def attr_value(node: Any) -> Any:
    """The value a ``get_attr`` node reads from the module that owns its graph (a parameter,
    buffer or constant), or None when ``node`` is not a ``get_attr`` node or its target is
    missing. Nothing is copied: do not modify the tensor returned."""
    if not isinstance(node, Node) or node.op != "get_attr" or not isinstance(node.target, str):
        return None
    owner = node.graph.owning_module
    if owner is None:
        return None
    try:
        return get_attr_value(owner, node.target)
    except AttributeError:
        return None


def copy_for_rewrite(model: GraphModule, *, reuse_working_copy: bool = False) -> tuple[GraphModule, dict[str, Node]]:
    """A working copy of ``model`` to rewrite, and its nodes by name.

    ``reuse_working_copy=True``: when ``model`` is the copy of the caller's graph that
    ``prepare_pt2e`` / ``prepare_qat_pt2e`` hands to ``transform_for_annotation`` (nothing
    else holds it), ``model`` itself is returned, to be rewritten in place (no second copy,
    and :func:`finish_rewrite` leaves its code to prepare's own rebuild). Only for a rewrite
    that returns the module it edits: an edit abandoned midway would stay in ``model``.
    Any other module, e.g. one a caller passes to ``transform_for_annotation`` directly, is
    copied as without it.

    The copy has its own graph, nodes and node meta dicts (shallow copies), and shares
    ``model``'s parameters, buffers and submodules (a tensor the graph writes in place is
    cloned), so edits to the copy's graph or attributes never reach ``model``. Call
    :func:`finish_rewrite` on it when done::

        def transform_for_annotation(self, model):
            todo = [n.name for n in model.graph.nodes if wanted(n)]
            if not todo:
                return model               # nothing to do: the caller's module, unchanged
            result, nodes = copy_for_rewrite(model)
            for name in todo:
                nodes[name].target = replacement
            return finish_rewrite(result)

    The graph is copied node by node (never ``copy.deepcopy``: that also deep-copies the
    exported pytree specs and makes torch warn about ``LeafSpec``)."""
    if not isinstance(model, GraphModule):
        raise TypeError(f"copy_for_rewrite expects a torch.fx.GraphModule; got {type(model).__name__}")
    if reuse_working_copy and is_working_copy(model):
        return model, {n.name: n for n in model.graph.nodes}
    result, _ = copy_graph_module(model)
    return result, {n.name: n for n in result.graph.nodes}


def finish_rewrite(model: GraphModule) -> GraphModule:
    """The rewritten copy as an ordinary GraphModule: the graph is checked (``lint``) and its
    Python code generated; attributes the graph no longer reads are dropped. Prepare's own
    working copy (``copy_for_rewrite(..., reuse_working_copy=True)``) is checked and returned
    with its code marked for regeneration: prepare's rebuild generates it, and drops them."""
    if is_working_copy(model):
        model.graph.lint()
        model.recompile()  # a lazy GraphModule: generated on first use
        return model
    return rebuild(model)

"""What runs after the matchers: the qparam-sharing pass (the rule-table rows without a
matcher: relu, max_pool2d, view, ... share their quantized input's qparams), and the reasons
written on what is left float."""

from __future__ import annotations

from collections.abc import Callable

from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave import authoring
from quantweave.authoring import calls, only_user
from quantweave.authoring import explain_float as record_reasons
from quantweave.plugin_api import is_annotated, mark_annotated

from ._graph import CONV, CONV_T, FILTERED, RELU, SHARE_QPARAMS, annotation

__all__ = ["explain_float", "no_quantized_input", "share_qparams"]

NodeFilter = Callable[[Node], bool]

REJECTED = "rejected by the filter function"
NO_QUANTIZED_INPUT = (
    "input {!r} has no quantized output: XNNPACK shares qparams through {} only after a quantized producer"
)
DYNAMIC_CONV_RELU = (
    "its only user is relu: XNNPACK quantizes conv + relu as one pattern, which a dynamic config does not apply"
)


def share_qparams(model: GraphModule, filter_fn: NodeFilter | None) -> None:
    """qparam-sharing ops whose input has output qparams take them (input and output)."""
    for node in model.graph.nodes:
        if not calls(node, SHARE_QPARAMS) or not node.args or is_annotated(node):
            continue
        producer = node.args[0]
        if not isinstance(producer, Node):
            continue
        found = annotation(producer)
        if found is None or found.output_qspec is None:
            continue
        if filter_fn is not None and not filter_fn(node):
            continue
        shared = qw.SharedQuantizationSpec(producer)
        authoring.annotate_input_qspec_map(node, producer, shared)
        authoring.annotate_output_qspec(node, shared)
        mark_annotated([node])


def no_quantized_input(node: Node) -> str | None:
    """Why a qparam-sharing op (a rule-table row without a matcher) stayed float."""
    if calls(node, SHARE_QPARAMS) and node.args and isinstance(node.args[0], Node):
        return NO_QUANTIZED_INPUT.format(node.args[0].name, str(node.target).split(".")[1])
    return None


_CONVS = CONV | CONV_T
#: the ops :func:`explain_float` looks at (as the authoring kit names them: in-place ops as functional)
_EXPLAINED = frozenset(str(op) for op in FILTERED | CONV | CONV_T)


def explain_float(model: GraphModule, filter_fn: NodeFilter | None, dynamic_only: bool) -> None:
    """A reason on every node of a declared op the quantizer left float without one (the
    annotation report shows it). ``dynamic_only``: every config the quantizer holds is dynamic."""

    def why(node: Node) -> str | None:
        if filter_fn is not None and calls(node, FILTERED) and not filter_fn(node):
            return REJECTED
        if calls(node, SHARE_QPARAMS):
            return no_quantized_input(node)
        if dynamic_only and calls(node, _CONVS):
            user = only_user(node)
            if user is not None and calls(user, RELU):
                return DYNAMIC_CONV_RELU
        return None

    record_reasons(model, _EXPLAINED, why)

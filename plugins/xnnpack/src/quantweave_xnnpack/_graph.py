"""What the XNNPACK quantizer reads off a graph: the aten op sets it matches, weight shapes,
scalar operands and the qparams producers already have (the rest is :mod:`quantweave.authoring`)."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from quantweave.authoring import attr_value, calls, tensor_value
from quantweave.plugin_api import ANNOTATION_KEY, is_annotated

aten = torch.ops.aten

CONV = frozenset(
    (
        aten.conv1d.default,
        aten.conv1d.padding,
        aten.conv2d.default,
        aten.conv2d.padding,
        aten.conv3d.default,
        aten.conv3d.padding,
    )
)
CONV_T = frozenset((aten.conv_transpose1d.default, aten.conv_transpose2d.input, aten.conv_transpose3d.input))
LINEAR = frozenset((aten.linear.default,))
ADD = frozenset((aten.add.Tensor, aten.add_.Tensor))
MUL = frozenset((aten.mul.Tensor, aten.mul_.Tensor))
CAT = frozenset((aten.cat.default,))
POOL = frozenset((aten.adaptive_avg_pool2d.default,))
RELU = frozenset((aten.relu.default, aten.relu_.default))
BATCH_NORM = frozenset((aten.batch_norm.default,))
#: ops whose output takes their (first) input's qparams when that input has output qparams
SHARE_QPARAMS = frozenset(
    (
        aten.relu.default,
        aten.relu_.default,
        aten.relu6.default,
        aten.relu6_.default,
        aten.hardtanh.default,
        aten.hardtanh_.default,
        aten.max_pool2d.default,
        aten.mean.default,
        aten.mean.dim,
        aten.permute.default,
        aten.permute_copy.default,
        aten.transpose.int,
        aten.squeeze.dim,
        aten.squeeze_copy.dim,
        aten.adaptive_avg_pool2d.default,
        aten.view_copy.default,
        aten.view.default,
        aten.reshape.default,
        aten.slice.Tensor,
        aten.slice_copy.Tensor,
        aten.flatten.using_ints,
        aten.dropout.default,
        aten.dropout_.default,
    )
)
#: compute ops a filter function can reject (named when they stay float for that reason)
FILTERED = CONV | CONV_T | LINEAR | ADD | MUL | CAT | POOL | SHARE_QPARAMS
#: torch.histc (inside HistogramObserver) fails beyond this magnitude
HISTC_LIMIT = 3.4028235e15


def weight_shape(node: Any) -> tuple[int, ...] | None:
    """Shape of a weight: from its fake value, or (a get_attr whose value a pass did not
    record, e.g. a batch-norm-folded weight) from the tensor itself."""
    value = tensor_value(node)
    if value is None:
        value = attr_value(node)
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def is_huge_scalar(node: Node) -> bool:
    value = attr_value(node)
    return isinstance(value, torch.Tensor) and value.numel() == 1 and abs(float(value.item())) > HISTC_LIMIT


def conv_transpose_groups(node: Node) -> int:
    groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
    return groups if isinstance(groups, int) else 1


def annotation(node: Node) -> Any:
    return node.meta.get(ANNOTATION_KEY)


def has_output_qparams(node: Node) -> bool:
    found = annotation(node)
    return found is not None and is_annotated(node) and found.output_qspec is not None


def traces_to_output_qparams(node: Node) -> bool:
    """True when ``node``, or the producer it reaches through qparam-sharing ops, has output qparams."""
    seen: set[Node] = set()
    current: Any = node
    while isinstance(current, Node) and current not in seen:
        seen.add(current)
        if has_output_qparams(current):
            return True
        if not calls(current, SHARE_QPARAMS) or not current.args:
            return False
        current = current.args[0]
    return False

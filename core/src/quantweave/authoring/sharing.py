"""Annotating an op whose inputs and output must share one range (``cat`` / ``concat`` and the like)."""

from __future__ import annotations

from collections.abc import Sequence

from torch.fx import Node

from ..annotation import QuantizationSpecBase, SharedQuantizationSpec, annotate_input_qspec_map, annotate_output_qspec

__all__ = ["share_inputs"]


def share_inputs(node: Node, inputs: Sequence[Node], owner: Node, spec: QuantizationSpecBase | None) -> None:
    """Give ``node``'s input ``owner`` the spec ``spec`` and every other input of ``inputs``, and
    ``node``'s output, a :class:`SharedQuantizationSpec` of the edge ``(owner, node)``: one
    observer for all of them, as backends need for a concatenation. ``owner`` is usually the
    first input that already has output qparams (so the shared range is the one it brings)."""
    if owner not in inputs:
        raise ValueError(
            f"share_inputs: the owner {owner.name!r} is not one of {node.name!r}'s inputs {[i.name for i in inputs]}"
        )
    annotate_input_qspec_map(node, owner, spec)
    shared = SharedQuantizationSpec((owner, node))
    for other in inputs:
        if other is not owner:
            annotate_input_qspec_map(node, other, shared)
    annotate_output_qspec(node, shared)

"""``ComposableQuantizer``: several quantizers over one graph, first annotator wins.

Members run in order (``transform_for_annotation``, then ``annotate``). A member must
leave alone what an earlier member annotated: replacing, removing *or mutating in place*
an earlier annotation raises :class:`AnnotationConflictError` naming both quantizers and
the node. ``validate`` and ``prepare_obs_or_fq_callback`` are forwarded to every member.
``quantization_capabilities()`` merges the members' declarations: for each
(pattern, mode) the first member declaring it serves it and later declarations are
shadowed (see :meth:`ComposableQuantizer.capability_table`).

Which member annotated a node is written into the node's meta
(:data:`~quantweave.annotation.ANNOTATED_BY_KEY`), never kept on the quantizer: one
composed quantizer can prepare any number of models, and each report reads its own graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.fx import GraphModule, Node

from .annotation import ANNOTATED_BY_KEY, ANNOTATION_KEY, EdgeOrNode, QuantizationAnnotation
from .capabilities import Capability, Mode, sort_capabilities
from .errors import AnnotationConflictError
from .quantizer import Quantizer

__all__ = ["AnnotationConflictError", "CapabilityRow", "ComposableQuantizer", "quantizer_label"]


def quantizer_label(quantizer: object) -> str:
    """How a quantizer is named in messages and reports: its ``name`` or its class name."""
    name = getattr(quantizer, "name", None)
    return name if isinstance(name, str) and name else type(quantizer).__name__


@dataclass(frozen=True)
class CapabilityRow:
    """Who serves one (pattern, mode) in a composition, and whose declarations it shadows."""

    pattern: str
    mode: Mode
    served_by: str
    shadowed: tuple[str, ...]
    capability: Capability


_Snapshot = tuple[tuple[tuple[Node, Any], ...], Any, bool, bool]


def _value(annotation: QuantizationAnnotation) -> _Snapshot:
    return (
        tuple(annotation.input_qspec_map.items()),
        annotation.output_qspec,
        annotation.allow_implicit_sharing,
        annotation._annotated,
    )


def _changed_fields(before: _Snapshot, after: _Snapshot) -> list[str]:
    names = ("input_qspec_map", "output_qspec", "allow_implicit_sharing", "_annotated")
    return [name for name, a, b in zip(names, before, after, strict=True) if a != b]


class ComposableQuantizer(Quantizer):
    """Chain quantizers; earlier members have priority over later ones."""

    def __init__(self, quantizers: Sequence[Quantizer]) -> None:
        members = list(quantizers)
        if not members:
            raise ValueError("ComposableQuantizer needs at least one quantizer; got an empty sequence")
        for index, member in enumerate(members):
            if not isinstance(member, Quantizer):
                raise TypeError(
                    f"ComposableQuantizer member {index} must be a quantweave.Quantizer; got {type(member).__name__}"
                )
        labels = [quantizer_label(q) for q in members]
        self.labels = [f"{label}#{i}" if labels.count(label) > 1 else label for i, label in enumerate(labels)]
        self.quantizers = members
        self.name = "+".join(self.labels)

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        for member, label in zip(self.quantizers, self.labels, strict=True):
            model = member.transform_for_annotation(model)
            if not isinstance(model, GraphModule):
                raise TypeError(
                    f"quantizer {label!r}: transform_for_annotation must return a GraphModule; "
                    f"got {type(model).__name__}"
                )
        return model

    def annotate(self, model: GraphModule) -> GraphModule:
        # node -> (annotation object, its value, owner label)
        seen: dict[Node, tuple[QuantizationAnnotation, _Snapshot, str]] = {}
        for node in model.graph.nodes:  # annotations made before composition belong to the caller
            annotation = node.meta.get(ANNOTATION_KEY)
            if isinstance(annotation, QuantizationAnnotation):
                seen[node] = (annotation, _value(annotation), "<pre-existing>")
        for member, label in zip(self.quantizers, self.labels, strict=True):
            member.annotate(model)
            for node, (annotation, value, owner) in seen.items():
                current = node.meta.get(ANNOTATION_KEY)
                if current is None:
                    what = "removed"
                elif current is not annotation:
                    what = "replaced"
                elif _value(current) != value:
                    what = f"mutated in place ({', '.join(_changed_fields(value, _value(current)))} changed)"
                else:
                    continue
                raise AnnotationConflictError(
                    f"quantizer {label!r} {what} the annotation that quantizer {owner!r} made on node "
                    f"{node.name!r}; a later quantizer must skip nodes an earlier one annotated "
                    "(check quantweave.is_annotated)"
                )
            for node in model.graph.nodes:
                annotation = node.meta.get(ANNOTATION_KEY)
                if node not in seen and isinstance(annotation, QuantizationAnnotation):
                    seen[node] = (annotation, _value(annotation), label)
                    if not isinstance(member, ComposableQuantizer) or ANNOTATED_BY_KEY not in node.meta:
                        node.meta[ANNOTATED_BY_KEY] = label  # a nested composition names its own members
        return model

    def validate(self, model: GraphModule) -> None:
        for member in self.quantizers:
            member.validate(model)

    def prepare_obs_or_fq_callback(
        self, model: GraphModule, edge_or_node_to_obs_or_fq: dict[EdgeOrNode, torch.nn.Module]
    ) -> None:
        for member in self.quantizers:
            member.prepare_obs_or_fq_callback(model, edge_or_node_to_obs_or_fq)

    def capability_table(self) -> list[CapabilityRow]:
        """One row per (pattern, mode): the serving member and the shadowed ones."""
        served: dict[tuple[str, Mode], tuple[str, Capability]] = {}
        shadowed: dict[tuple[str, Mode], list[str]] = {}
        for member, label in zip(self.quantizers, self.labels, strict=True):
            for cap in member.quantization_capabilities():
                if not isinstance(cap, Capability):
                    raise TypeError(
                        f"quantizer {label!r}: quantization_capabilities() must return Capability records; "
                        f"got {type(cap).__name__}"
                    )
                if not cap.quantizer:
                    cap = replace(cap, quantizer=label)
                if not cap.plugin and member.plugin:
                    cap = replace(cap, plugin=member.plugin)
                if cap.key in served:
                    if served[cap.key][0] != label:
                        shadowed.setdefault(cap.key, []).append(label)
                else:
                    served[cap.key] = (label, cap)
        rows = [
            CapabilityRow(pattern, mode, label, tuple(shadowed.get((pattern, mode), ())), cap)
            for (pattern, mode), (label, cap) in served.items()
        ]
        return sorted(rows, key=lambda r: (r.pattern, r.mode.value))

    def quantization_capabilities(self) -> list[Capability]:
        """The served capabilities (first declaring member wins), with provenance."""
        return sort_capabilities(row.capability for row in self.capability_table())

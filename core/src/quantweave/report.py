"""What was quantized, by whom, and what stayed float and why.

``annotation_report(model, quantizer)`` reads the annotations that ``prepare_pt2e`` leaves
on the prepared model's nodes (or on an annotated graph) and lists every node whose op is
in the pattern vocabulary (core patterns, and the patterns the quantizer's capabilities
name): ``quantized`` with the quantizer that annotated it
(``node.meta[ANNOTATED_BY_KEY]``, written by ``mark_annotated(..., by=...)`` and by
``ComposableQuantizer``), or ``float`` with a reason:

- a quantizer may record why it skipped a node with ``set_skip_reason(node, reason)``
  (e.g. ``"module name 'layers.0' configured None"``); that text is the reason;
- otherwise: ``"no quantizer claims this pattern"``.

A node a quantizer claimed without specs of its own (the relu of a fused conv + relu) is
reported ``quantized`` by that quantizer, with the reason that it is fused.

Printable as an aligned table (:meth:`AnnotationReport.to_table`) and as JSON.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from torch.fx import GraphModule

from ._modules.text import render_table
from .annotation import ANNOTATED_BY_KEY, ANNOTATION_KEY, SKIP_REASON_KEY, QuantizationAnnotation
from .capabilities import PATTERNS

__all__ = ["SKIP_REASON_KEY", "AnnotationReport", "NodeReport", "annotation_report", "reported_ops"]

NO_CLAIM = "no quantizer claims this pattern"
FUSED = "fused: runs inside the quantized pattern of its neighbours (claimed without specs of its own)"


def reported_ops(capabilities: Iterable[Any] = ()) -> frozenset[str]:
    """The op names the report lists: every op of the core vocabulary, and the ops of the
    given capabilities (patterns that plugins contribute)."""
    ops = {op for _, pattern_ops in PATTERNS.values() for op in pattern_ops}
    ops.update(op for cap in capabilities for op in getattr(cap, "ops", ()))
    return frozenset(ops)


@dataclass(frozen=True)
class NodeReport:
    node: str
    op: str
    status: str  # "quantized" or "float"
    quantizer: str | None
    reason: str | None


@dataclass(frozen=True)
class AnnotationReport:
    nodes: tuple[NodeReport, ...]

    @property
    def quantized(self) -> int:
        return sum(1 for n in self.nodes if n.status == "quantized")

    @property
    def float(self) -> int:
        return sum(1 for n in self.nodes if n.status == "float")

    def by_quantizer(self) -> dict[str, int]:
        return dict(Counter(n.quantizer for n in self.nodes if n.quantizer is not None))

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [asdict(n) for n in self.nodes],
            "summary": {"quantized": self.quantized, "float": self.float, "by_quantizer": self.by_quantizer()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_table(self) -> str:
        header = ("node", "op", "status", "quantizer", "reason")
        rows = [(n.node, n.op, n.status, n.quantizer or "-", n.reason or "") for n in self.nodes]
        lines = render_table(header, rows).splitlines()
        per = ", ".join(f"{q}: {c}" for q, c in sorted(self.by_quantizer().items())) or "none"
        lines.append(f"{self.quantized} quantized ({per}), {self.float} float, of {len(self.nodes)} compute nodes")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_table()


def _is_quantized(annotation: object) -> bool:
    return isinstance(annotation, QuantizationAnnotation) and (
        annotation.output_qspec is not None or any(s is not None for s in annotation.input_qspec_map.values())
    )


def _claimed(annotation: object) -> bool:
    return isinstance(annotation, QuantizationAnnotation) and annotation._annotated


def annotation_report(model: GraphModule, quantizer: object | None = None) -> AnnotationReport:
    """Report every vocabulary node of ``model`` (prepared or annotated) as quantized or float.

    ``quantizer``: the quantizer used; it names nodes its members did not name themselves,
    and its declared capabilities add contributed patterns' ops to what is listed.
    """
    from .compose import quantizer_label

    if not isinstance(model, GraphModule):
        raise TypeError(f"annotation_report expects a prepared or annotated GraphModule; got {type(model).__name__}")
    default = None if quantizer is None else quantizer_label(quantizer)
    try:
        declared = getattr(quantizer, "quantization_capabilities", None)
        capabilities = list(declared()) if callable(declared) else []
    except Exception:  # a broken declaration must not hide what was quantized; list core ops only
        capabilities = []
    ops = reported_ops(capabilities)
    reports: list[NodeReport] = []
    for node in model.graph.nodes:
        op = str(node.target)
        if node.op != "call_function" or op not in ops:
            continue
        annotation = node.meta.get(ANNOTATION_KEY)
        reason = node.meta.get(SKIP_REASON_KEY)
        by = node.meta.get(ANNOTATED_BY_KEY)
        owner = by if isinstance(by, str) else default
        if _is_quantized(annotation):
            reports.append(NodeReport(node.name, op, "quantized", owner, None))
        elif _claimed(annotation) and not isinstance(reason, str):
            # claimed without specs of its own: part of a fused quantized unit (conv + relu)
            reports.append(NodeReport(node.name, op, "quantized", owner, FUSED))
        else:
            reports.append(NodeReport(node.name, op, "float", None, reason if isinstance(reason, str) else NO_CLAIM))
    return AnnotationReport(tuple(reports))

"""What was quantized, by whom, and what stayed float and why.

``annotation_report(model, quantizer)`` reads the annotations that ``prepare_pt2e`` leaves
on the prepared model's nodes (or on an annotated graph) and lists every compute node:
``quantized`` with the quantizer that annotated it, or ``float`` with a reason:

- a quantizer may record why it skipped a node in ``node.meta[SKIP_REASON_KEY]``
  (e.g. ``"module name 'layers.0' configured None"``); that text is the reason;
- otherwise: ``"no quantizer claims this pattern"``.

Printable as an aligned table (:meth:`AnnotationReport.to_table`) and as JSON.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.fx import GraphModule

from .annotation import ANNOTATION_KEY, QuantizationAnnotation

__all__ = ["SKIP_REASON_KEY", "AnnotationReport", "NodeReport", "annotation_report", "compute_ops"]

#: ``node.meta`` key where a quantizer records, as a string, why it left a node float.
SKIP_REASON_KEY = "quantweave_skip_reason"
NO_CLAIM = "no quantizer claims this pattern"
FUSED = "claimed by a quantizer without quantization specs (fused into a neighbouring pattern)"

_COMPUTE_OP_NAMES = (
    "conv1d.default",
    "conv2d.default",
    "conv3d.default",
    "conv_transpose1d.default",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "linear.default",
    "matmul.default",
    "bmm.default",
    "mm.default",
    "addmm.default",
    "add.Tensor",
    "mul.Tensor",
    "cat.default",
    "max_pool2d.default",
    "avg_pool2d.default",
    "adaptive_avg_pool2d.default",
    "embedding.default",
    "sigmoid.default",
    "softmax.int",
    "relu.default",
    "hardtanh.default",
    "gelu.default",
    "layer_norm.default",
)


@functools.cache
def compute_ops() -> frozenset[Any]:
    """The aten ops the report lists: compute ops a backend could run quantized
    (resolved on first use, so importing quantweave stays cheap)."""
    ops = set()
    for name in _COMPUTE_OP_NAMES:
        packet, overload = name.split(".")
        ops.add(getattr(getattr(torch.ops.aten, packet), overload))
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
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
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
    """Report every compute node of ``model`` (prepared or annotated) as quantized or float.

    ``quantizer``: the quantizer used; with a ``ComposableQuantizer`` the member that
    annotated each node is named, otherwise the quantizer's label.
    """
    from .compose import ComposableQuantizer, quantizer_label

    if not isinstance(model, GraphModule):
        raise TypeError(f"annotation_report expects a prepared or annotated GraphModule; got {type(model).__name__}")
    owners = quantizer.owners if isinstance(quantizer, ComposableQuantizer) else {}
    default = None if quantizer is None else quantizer_label(quantizer)
    reports: list[NodeReport] = []
    ops = compute_ops()
    for node in model.graph.nodes:
        if node.op != "call_function" or node.target not in ops:
            continue
        annotation = node.meta.get(ANNOTATION_KEY)
        op = str(node.target)
        if _is_quantized(annotation):
            reports.append(NodeReport(node.name, op, "quantized", owners.get(node.name, default), None))
            continue
        reason = node.meta.get(SKIP_REASON_KEY)
        if not isinstance(reason, str):
            reason = FUSED if _claimed(annotation) else NO_CLAIM
        reports.append(NodeReport(node.name, op, "float", None, reason))
    return AnnotationReport(tuple(reports))

"""What was quantized, by whom, and what stayed float and why.

``annotation_report(model, quantizer)`` reads the annotations that ``prepare_pt2e`` leaves
on the prepared model's nodes (or on an annotated graph) and lists every node whose op is
in the pattern vocabulary (core patterns, and the patterns the quantizer's capabilities
name): ``quantized`` with the quantizer that annotated it
(``node.meta[ANNOTATED_BY_KEY]``, written by ``mark_annotated(..., by=...)`` and by
``ComposableQuantizer``), or ``float`` with the reason, from the quantizer that
considered the node. ``NodeReport.kind`` says which kind of reason it is:

- ``"skipped"``: a quantizer claimed the node and recorded why it left it float
  (``set_skip_reason``; e.g. ``"module name 'layers.0' configured None"``), or recorded a
  reason for an op it does not declare;
- ``"not_applicable"``: a quantizer (member) declares a pattern with this op, but its rule
  does not apply here; the reason is the rule it recorded with ``set_skip_reason``
  (``"input is not quantized by an x86 pattern"``, ``"not followed by a quantized consumer"``);
- ``"shadowed"`` (compositions): a member declares a pattern through this node, but an
  earlier member claimed the rest of it (named, with the pattern it serves it as, from
  :meth:`~quantweave.ComposableQuantizer.capability_table`);
- ``"unexplained"``: a quantizer declares a pattern with this op, left the node float and
  recorded no reason (said as such, never hidden behind "no quantizer claims");
- ``"undeclared"``: no quantizer (member) declares a pattern with this op.

A node a quantizer claimed without specs of its own (the relu of a fused conv + relu) is
reported ``quantized`` by that quantizer, with the reason that it is fused
(``kind="fused"``).

Printable as an aligned table (:meth:`AnnotationReport.to_table`) and as JSON.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from torch.fx import GraphModule, Node

from ._modules.text import render_table
from .annotation import ANNOTATED_BY_KEY, ANNOTATION_KEY, SKIP_REASON_KEY, QuantizationAnnotation
from .capabilities import PATTERNS

__all__ = ["KINDS", "SKIP_REASON_KEY", "AnnotationReport", "NodeReport", "annotation_report", "reported_ops"]

NO_CLAIM = "no quantizer claims this pattern"  # only when the report is given no quantizer
FUSED = "fused: runs inside the quantized pattern of its neighbours (claimed without specs of its own)"
#: the kinds of :attr:`NodeReport.kind`
KINDS = ("quantized", "fused", "skipped", "not_applicable", "shadowed", "unexplained", "undeclared")


def reported_ops(capabilities: Iterable[Any] = ()) -> frozenset[str]:
    """The op names the report lists: every op of the core vocabulary, and the ops of the
    given capabilities (patterns that plugins contribute)."""
    ops = {op for _, pattern_ops in PATTERNS.values() for op in pattern_ops}
    ops.update(op for cap in capabilities for op in getattr(cap, "ops", ()))
    return frozenset(ops)


@dataclass(frozen=True)
class NodeReport:
    """One node: ``status`` is ``"quantized"`` or ``"float"``; ``quantizer`` the one that
    quantized it (None when float); ``reason`` why it is float (or fused), in words;
    ``kind`` which kind of reason (:data:`KINDS`)."""

    node: str
    op: str
    status: str  # "quantized" or "float"
    quantizer: str | None
    reason: str | None
    kind: str = "quantized"


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
        return dict(Counter(n.quantizer for n in self.nodes if n.status == "quantized" and n.quantizer is not None))

    def float_by_kind(self) -> dict[str, int]:
        """How many float nodes have each kind of reason."""
        return dict(Counter(n.kind for n in self.nodes if n.status == "float"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [asdict(n) for n in self.nodes],
            "summary": {
                "quantized": self.quantized,
                "float": self.float,
                "by_quantizer": self.by_quantizer(),
                "float_by_kind": self.float_by_kind(),
            },
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


class _Considered:
    """Who could have quantized a node: the members (in order), what each declares, and
    the composition's capability table (for naming the pattern an earlier member serves)."""

    def __init__(self, quantizer: object | None) -> None:
        from .compose import ComposableQuantizer, quantizer_label

        self.quantizer = quantizer
        self.composed = isinstance(quantizer, ComposableQuantizer)
        self.members: list[tuple[str, object]] = []

        def flatten(q: object, label: str) -> None:
            if isinstance(q, ComposableQuantizer):
                for member, member_label in zip(q.quantizers, q.labels, strict=True):
                    flatten(member, member_label)
            else:
                self.members.append((label, q))

        if quantizer is not None:
            flatten(quantizer, quantizer_label(quantizer))
        # op -> [(member label, capability)], member order, shortest pattern first
        self.declared: dict[str, list[tuple[str, Any]]] = {}
        self.capabilities: list[Any] = []
        for label, member in self.members:
            for cap in sorted(_capabilities_of(member), key=lambda c: len(getattr(c, "ops", ()))):
                self.capabilities.append(cap)
                for op in getattr(cap, "ops", ()):
                    self.declared.setdefault(op, []).append((label, cap))
        self._table: list[Any] | None = None

    def order(self, label: str) -> int:
        labels = [lb for lb, _ in self.members]
        return labels.index(label) if label in labels else -1

    def declarers(self, op: str) -> str:
        """``"x86 (conv2d_relu, linear_relu, +3 more)"``: who declares a pattern with ``op``."""
        by: dict[str, list[str]] = {}
        for label, cap in self.declared.get(op, []):
            patterns = by.setdefault(label, [])
            if cap.pattern not in patterns:
                patterns.append(cap.pattern)
        parts = []
        for label, patterns in by.items():
            shown = ", ".join(patterns[:3]) + (f", +{len(patterns) - 3} more" if len(patterns) > 3 else "")
            parts.append(f"{label} ({shown})")
        return " and ".join(parts)

    def served_as(self, pattern: str, mode: Any, step: int) -> tuple[str, str] | None:
        if self._table is None:
            try:
                table = getattr(self.quantizer, "capability_table", None)
                self._table = list(table()) if callable(table) else []
            except Exception:  # a broken declaration must not hide what was quantized
                self._table = []
        for row in self._table:
            if row.pattern == pattern and row.mode == mode and step < len(row.served_as):
                found = row.served_as[step]
                return None if found is None else (str(found[0]), str(found[1]))
        return None


def _capabilities_of(quantizer: object) -> list[Any]:
    try:
        declared = getattr(quantizer, "quantization_capabilities", None)
        return list(declared()) if callable(declared) else []
    except Exception:  # a broken declaration must not hide what was quantized; list core ops only
        return []


class _Graph:
    """The model's graph seen through its observers: a prepared model has observer (or
    fake-quantize) modules between ops; patterns are matched as if they were not there."""

    def __init__(self, model: GraphModule) -> None:
        from ._modules.patterns import chain_of
        from .observers import is_observer_module

        self.chain_of = chain_of
        self.observer = {
            n
            for n in model.graph.nodes
            if n.op == "call_module" and is_observer_module(_submodule(model, str(n.target)))
        }
        self._occurrences: dict[tuple[str, ...], list[tuple[Node, ...]]] = {}
        self.nodes = list(model.graph.nodes)

    def users(self, node: Node) -> list[Node]:
        out: list[Node] = []
        for user in node.users:
            out += self.users(user) if user in self.observer else [user]
        return out

    def producer(self, node: Node) -> Node | None:
        """The op feeding ``node``'s first input, through observers."""
        inputs = node.all_input_nodes
        source = inputs[0] if inputs else None
        while source is not None and source in self.observer:
            source = source.all_input_nodes[0] if source.all_input_nodes else None
        return source

    def occurrences(self, ops: tuple[str, ...]) -> list[tuple[Node, ...]]:
        if ops not in self._occurrences:
            chain = self.chain_of(ops)
            found: list[tuple[Node, ...]] = []

            def extend(path: tuple[Node, ...]) -> None:
                if len(path) == len(chain):
                    found.append(path)
                    return
                for user in self.users(path[-1]):
                    if user.op == "call_function" and str(user.target) in chain[len(path)]:
                        extend((*path, user))

            for node in self.nodes:
                if node.op == "call_function" and str(node.target) in chain[0]:
                    extend((node,))
            self._occurrences[ops] = found
        return self._occurrences[ops]


def _submodule(model: GraphModule, target: str) -> object:
    try:
        return model.get_submodule(target)
    except AttributeError:
        return None


def _owner(node: Node, default: str | None) -> str | None:
    by = node.meta.get(ANNOTATED_BY_KEY)
    return by if isinstance(by, str) else default


def _shadowed(node: Node, graph: _Graph, considered: _Considered, default: str | None) -> str | None:
    """Why a float node is shadowed in a composition: a member declares a pattern through
    it, and an earlier member claimed another node of that occurrence (or, for a pattern
    quantized only after the member's own patterns, its producer)."""
    if not considered.composed:
        return None
    op = str(node.target)
    for label, cap in considered.declared.get(op, []):
        rank = considered.order(label)
        candidates: list[tuple[int, Node]] = []
        for occurrence in graph.occurrences(tuple(cap.ops)):
            if node in occurrence:
                candidates += [(i, other) for i, other in enumerate(occurrence) if other is not node]
        if getattr(cap, "input_from", None) == "own":
            producer = graph.producer(node)
            if producer is not None and producer.op == "call_function":
                candidates.append((-1, producer))
        for step, other in candidates:
            if not _claimed(other.meta.get(ANNOTATION_KEY)):
                continue
            by = _owner(other, default)
            if by is None or by == label or not 0 <= considered.order(by) < rank:
                continue
            where = other.name if other.name == _short(other) else f"{other.name} ({_short(other)})"
            if step < 0:
                return (
                    f"shadowed: {label} quantizes {cap.pattern} only after its own patterns, and its input {where} "
                    f"is served by earlier member {by}"
                )
            served = considered.served_as(cap.pattern, cap.mode, step)
            as_what = f" as its {served[1]}" if served is not None and served[0] == by else ""
            return (
                f"shadowed: {cap.pattern} (declared by {label}) is served here by earlier member {by}{as_what}, "
                f"which claimed {where}"
            )
    return None


def _short(node: Node) -> str:
    parts = str(node.target).split(".")
    return parts[1] if len(parts) == 3 else str(node.target)


def _float_reason(
    node: Node, graph: _Graph, considered: _Considered, default: str | None, reason: object
) -> tuple[str, str]:
    """(kind, reason in words) for a float node."""
    op = str(node.target)
    annotation = node.meta.get(ANNOTATION_KEY)
    if _claimed(annotation) and isinstance(reason, str):
        owner = _owner(node, default)
        return "skipped", reason if owner is None else f"skipped by {owner}: {reason}"
    shadowed = _shadowed(node, graph, considered, default)
    if shadowed is not None:
        return "shadowed", shadowed
    declared = considered.declared.get(op)
    if declared and isinstance(reason, str):
        return "not_applicable", f"declared by {considered.declarers(op)} but not applicable here: {reason}"
    if isinstance(reason, str):
        return "skipped", reason
    if declared:
        who = " and ".join(dict.fromkeys(label for label, _ in declared))
        return "unexplained", f"declared by {considered.declarers(op)} but left float; {who} gave no reason"
    if considered.quantizer is None:
        return "undeclared", NO_CLAIM
    if considered.composed:
        labels = ", ".join(label for label, _ in considered.members)
        return "undeclared", f"no member ({labels}) declares a pattern with this op"
    return "undeclared", f"{considered.members[0][0]} declares no pattern with this op"


def annotation_report(model: GraphModule, quantizer: object | None = None) -> AnnotationReport:
    """Report every vocabulary node of ``model`` (prepared or annotated) as quantized or float.

    ``quantizer``: the quantizer used; it names nodes its members did not name themselves,
    its (its members') declared capabilities add contributed patterns' ops to what is
    listed, and say for each float node whether some member declares its op (and then why
    it was not applied: the member's recorded rule, or shadowing by an earlier member).
    """
    from .compose import quantizer_label

    if not isinstance(model, GraphModule):
        raise TypeError(f"annotation_report expects a prepared or annotated GraphModule; got {type(model).__name__}")
    default = None if quantizer is None else quantizer_label(quantizer)
    considered = _Considered(quantizer)
    ops = reported_ops(considered.capabilities)
    graph = _Graph(model)
    reports: list[NodeReport] = []
    for node in model.graph.nodes:
        op = str(node.target)
        if node.op != "call_function" or op not in ops:
            continue
        annotation = node.meta.get(ANNOTATION_KEY)
        reason = node.meta.get(SKIP_REASON_KEY)
        owner = _owner(node, default)
        if _is_quantized(annotation):
            reports.append(NodeReport(node.name, op, "quantized", owner, None))
        elif _claimed(annotation) and not isinstance(reason, str):
            # claimed without specs of its own: part of a fused quantized unit (conv + relu)
            reports.append(NodeReport(node.name, op, "quantized", owner, FUSED, "fused"))
        else:
            kind, why = _float_reason(node, graph, considered, default, reason)
            reports.append(NodeReport(node.name, op, "float", None, why, kind))
    return AnnotationReport(tuple(reports))

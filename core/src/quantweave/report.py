"""What was quantized, by whom, and what stayed float and why.

``annotation_report(model, quantizer)`` reads the annotations that ``prepare_pt2e`` leaves
on the prepared model's nodes (or on an annotated graph) and lists every node whose op is
in the pattern vocabulary (core patterns, and the patterns the quantizer's capabilities
name) or is a compute op (:data:`COMPUTE_OPS`: convolutions, linear, addmm, mm, bmm,
matmul, einsum, embedding..., declared by a plugin or by nobody; an in-place op such as
``relu_`` and a conv with ``padding="same"`` count as the op they compute,
``quantweave.capabilities.vocabulary_op``): ``quantized`` with the quantizer
that annotated it (``node.meta[ANNOTATED_BY_KEY]``, written by ``mark_annotated(..., by=...)`` and by
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

With ``numerics=`` (what :func:`quantweave.compare` returned for the converted model) each
row of a node the debugger compared carries its numerics (op and model SQNR, max error):
a column pair in the table (``worst_first=True`` orders those rows worst first) and a
``"numerics"`` object in the JSON. Rows are matched by node name -- the identity prepare
and convert keep -- and must call the same op; compared ops the report does not list
(outside the pattern vocabulary, e.g. a flatten reading a dequantized tensor) are named in
:attr:`AnnotationReport.numerics_unmatched`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from torch.fx import GraphModule, Node

from ._modules.foreign import is_annotation_like
from ._modules.patterns import node_op
from ._modules.text import format_db, json_number, render_table
from .annotation import ANNOTATED_BY_KEY, ANNOTATION_KEY, SKIP_REASON_KEY
from .vocabulary import Vocabulary, core_vocabulary

if TYPE_CHECKING:
    from .numerics import NumericsReport, OpNumerics

__all__ = [
    "COMPUTE_OPS",
    "KINDS",
    "SKIP_REASON_KEY",
    "AnnotationReport",
    "NodeReport",
    "annotation_report",
    "reported_ops",
]

NO_CLAIM = "no quantizer claims this pattern"  # only when the report is given no quantizer
FUSED = "fused: runs inside the quantized pattern of its neighbours (claimed without specs of its own)"
#: the kinds of :attr:`NodeReport.kind`
KINDS = ("quantized", "fused", "skipped", "not_applicable", "shadowed", "unexplained", "undeclared")


#: the compute ops (weighted ops and matrix products) the report always lists, whether a
#: pattern of the vocabulary names them or not: a model's compute left float is never hidden
COMPUTE_OPS = frozenset(
    f"aten.{op}"
    for op in (
        "conv1d.default",
        "conv2d.default",
        "conv3d.default",
        "conv_transpose1d.default",
        "conv_transpose2d.input",
        "conv_transpose3d.input",
        "convolution.default",
        "linear.default",
        "addmm.default",
        "mm.default",
        "bmm.default",
        "baddbmm.default",
        "addbmm.default",
        "matmul.default",
        "mv.default",
        "addmv.default",
        "einsum.default",
        "embedding.default",
        "embedding_bag.default",
    )
)


def reported_ops(capabilities: Iterable[Any] = (), vocabulary: Vocabulary | None = None) -> frozenset[str]:
    """The op names the report lists: every op of the vocabulary (default the core's), the
    ops of the given capabilities (patterns that plugins contribute) and the compute ops
    (:data:`COMPUTE_OPS`: convolutions, linear, addmm, mm, bmm, matmul, einsum, embedding...)."""
    ops = set(COMPUTE_OPS)
    ops.update((core_vocabulary() if vocabulary is None else vocabulary).all_ops())
    ops.update(op for cap in capabilities for op in getattr(cap, "ops", ()))
    return frozenset(ops)


@dataclass(frozen=True)
class NodeReport:
    """One node: ``status`` is ``"quantized"`` or ``"float"``; ``quantizer`` the one that
    quantized it (None when float); ``reason`` why it is float (or fused), in words;
    ``kind`` which kind of reason (:data:`KINDS`); ``numerics`` what
    :func:`quantweave.compare` measured at this node, when the report was given its result
    and it compared the node (None otherwise)."""

    node: str
    op: str
    status: str  # "quantized" or "float"
    quantizer: str | None
    reason: str | None
    kind: str = "quantized"
    numerics: OpNumerics | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The node as JSON-able values (``numerics`` only when present; infinite SQNR as
        the string ``"inf"``)."""
        data = {k: v for k, v in asdict(self).items() if k != "numerics"}
        if self.numerics is not None:
            op = self.numerics
            data["numerics"] = {
                "sqnr_db": json_number(op.sqnr_db),
                "max_abs_error": json_number(op.max_abs_error),
                "cumulative_sqnr_db": json_number(op.cumulative_sqnr_db),
                "cumulative_max_abs_error": json_number(op.cumulative_max_abs_error),
                "compared_with": op.compared_with,
            }
        return data


@dataclass(frozen=True)
class AnnotationReport:
    """Every vocabulary node of a model, quantized or float (and why). With numerics:
    ``numerics_batches`` the batches :func:`quantweave.compare` ran, and
    ``numerics_unmatched`` the compared nodes no row took, each with the reason."""

    nodes: tuple[NodeReport, ...]
    numerics_batches: int | None = None
    numerics_unmatched: tuple[tuple[str, str], ...] = ()

    @property
    def has_numerics(self) -> bool:
        return self.numerics_batches is not None

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

    def worst_first(self) -> tuple[NodeReport, ...]:
        """The rows with numerics, lowest op SQNR first, then the others in graph order."""
        with_numerics = [n for n in self.nodes if n.numerics is not None]
        with_numerics.sort(key=lambda n: (n.numerics.sqnr_db, n.numerics.cumulative_sqnr_db))  # type: ignore[union-attr]
        return (*with_numerics, *(n for n in self.nodes if n.numerics is None))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "nodes": [n.to_dict() for n in self.nodes],
            "summary": {
                "quantized": self.quantized,
                "float": self.float,
                "by_quantizer": self.by_quantizer(),
                "float_by_kind": self.float_by_kind(),
            },
        }
        if self.has_numerics:
            data["summary"]["numerics"] = {
                "batches": self.numerics_batches,
                "matched": sum(1 for n in self.nodes if n.numerics is not None),
                "unmatched": [{"node": node, "reason": reason} for node, reason in self.numerics_unmatched],
            }
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_table(self, worst_first: bool = False, limit: int | None = None) -> str:
        """The aligned table. ``worst_first``: the rows with numerics first, lowest op SQNR
        first; ``limit``: at most that many rows (the summary still counts them all)."""
        nodes = self.worst_first() if worst_first else self.nodes
        shown = nodes if limit is None else nodes[: max(limit, 0)]
        rows: list[tuple[str, ...]]
        if self.has_numerics:
            header: tuple[str, ...] = ("node", "op", "status", "quantizer", "op SQNR dB", "op max err", "model SQNR dB")
            header += ("reason",)
            rows = [
                (
                    n.node,
                    n.op,
                    n.status,
                    n.quantizer or "-",
                    *(
                        ("-", "-", "-")
                        if n.numerics is None
                        else (
                            format_db(n.numerics.sqnr_db),
                            f"{n.numerics.max_abs_error:.4g}",
                            format_db(n.numerics.cumulative_sqnr_db),
                        )
                    ),
                    n.reason or "",
                )
                for n in shown
            ]
        else:
            header = ("node", "op", "status", "quantizer", "reason")
            rows = [(n.node, n.op, n.status, n.quantizer or "-", n.reason or "") for n in shown]
        lines = render_table(header, rows).splitlines()
        if len(shown) < len(nodes):
            lines.append(f"... {len(nodes) - len(shown)} more row(s)")
        per = ", ".join(f"{q}: {c}" for q, c in sorted(self.by_quantizer().items())) or "none"
        lines.append(f"{self.quantized} quantized ({per}), {self.float} float, of {len(self.nodes)} compute nodes")
        if self.has_numerics:
            matched = sum(1 for n in self.nodes if n.numerics is not None)
            line = f"numerics: {matched} node(s) compared on {self.numerics_batches} batch(es)"
            if self.numerics_unmatched:
                line += "; compared but not in this report: " + ", ".join(
                    f"{node} ({reason})" for node, reason in self.numerics_unmatched
                )
            lines.append(line)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_table()


def _is_quantized(annotation: Any) -> bool:  # quantweave's annotations, or a hosted quantizer's (torchao's)
    return is_annotation_like(annotation) and (
        annotation.output_qspec is not None or any(s is not None for s in annotation.input_qspec_map.values())
    )


def _claimed(annotation: Any) -> bool:
    return is_annotation_like(annotation) and bool(getattr(annotation, "_annotated", False))


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
        from .observers import is_observer_module

        self.observer = {
            n
            for n in model.graph.nodes
            if n.op == "call_module" and is_observer_module(_submodule(model, str(n.target)))
        }
        self._occurrences: dict[tuple[str, ...], list[tuple[Node, ...]]] = {}
        self.graph = model.graph

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
        """Where the chain ``ops`` occurs, matched through observers (the vocabulary's matcher)."""
        if ops not in self._occurrences:
            self._occurrences[ops] = Vocabulary.occurrences(self.graph, ops, self.users)
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
    op = node_op(node)
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


def _outside_its_chains(node: Node, graph: _Graph, declared: list[tuple[str, Any]]) -> str | None:
    """Why a float node needs no reason of its quantizers: its op is declared only inside
    chains of several ops (relu6 inside conv2d_relu6, the fused activation) and the node is in
    no occurrence of any of them. None when some declaration is of the op alone, or the node
    is in an occurrence (then a float node is the quantizer's to explain)."""
    if not declared or any(len(tuple(cap.ops)) < 2 for _, cap in declared):
        return None
    if any(node in occurrence for _, cap in declared for occurrence in graph.occurrences(tuple(cap.ops))):
        return None
    chains = ", ".join(dict.fromkeys(f"{cap.pattern} ({label})" for label, cap in declared))
    producer = graph.producer(node)
    after = f"; it follows {producer.name} ({_short(producer)})" if producer is not None else ""
    return f"{_short(node)} is declared only inside {chains}, and this node is in no occurrence of them{after}"


def _short(node: Node) -> str:
    parts = str(node.target).split(".")
    return parts[1] if len(parts) == 3 else str(node.target)


def _float_reason(
    node: Node, graph: _Graph, considered: _Considered, default: str | None, reason: object
) -> tuple[str, str]:
    """(kind, reason in words) for a float node."""
    op = node_op(node)
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
    outside = _outside_its_chains(node, graph, declared or [])
    if outside is not None:
        return "not_applicable", outside
    if declared:
        who = " and ".join(dict.fromkeys(label for label, _ in declared))
        return "unexplained", f"declared by {considered.declarers(op)} but left float; {who} gave no reason"
    if considered.quantizer is None:
        return "undeclared", NO_CLAIM
    if considered.composed:
        labels = ", ".join(label for label, _ in considered.members)
        return "undeclared", f"no member ({labels}) declares a pattern with this op"
    return "undeclared", f"{considered.members[0][0]} declares no pattern with this op"


def annotation_report(
    model: GraphModule,
    quantizer: object | None = None,
    *,
    numerics: NumericsReport | None = None,
    vocabulary: Vocabulary | None = None,
) -> AnnotationReport:
    """Report every vocabulary node of ``model`` (prepared or annotated) as quantized or float.

    ``quantizer``: the quantizer used; it names nodes its members did not name themselves,
    its (its members') declared capabilities add contributed patterns' ops to what is
    listed, and say for each float node whether some member declares its op (and then why
    it was not applied: the member's recorded rule, or shadowing by an earlier member).

    ``numerics``: the :func:`quantweave.compare` result for the model converted from this
    one; each row of a node it compared (same name, same op) carries its
    :class:`~quantweave.numerics.OpNumerics`. Raises ``ValueError`` when it compared ops but
    none matches a node of ``model`` (the result of another model).

    ``vocabulary``: the patterns whose ops are listed (default the core vocabulary; a
    registry's, core and contributed, is ``PluginManager.vocabulary()``).
    """
    from .compose import quantizer_label

    if not isinstance(model, GraphModule):
        raise TypeError(f"annotation_report expects a prepared or annotated GraphModule; got {type(model).__name__}")
    default = None if quantizer is None else quantizer_label(quantizer)
    considered = _Considered(quantizer)
    ops = reported_ops(considered.capabilities, vocabulary)
    graph = _Graph(model)
    reports: list[NodeReport] = []
    for node in model.graph.nodes:
        op = str(node.target)
        if node.op != "call_function" or node_op(node) not in ops:
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
    if numerics is None:
        return AnnotationReport(tuple(reports))
    return _with_numerics(tuple(reports), numerics, {n.name: str(n.target) for n in model.graph.nodes})


def _with_numerics(
    reports: tuple[NodeReport, ...], numerics: NumericsReport, graph_ops: dict[str, str]
) -> AnnotationReport:
    """The rows with the numerics of the nodes compared (matched by name and op)."""
    from .numerics import NumericsReport

    if not isinstance(numerics, NumericsReport):
        raise TypeError(
            "annotation_report: numerics must be what quantweave.compare(float_model, converted, inputs) returned "
            f"(a NumericsReport); got {type(numerics).__name__}"
        )
    by_node = numerics.by_node()
    rows = {r.node: r for r in reports}
    unmatched: list[tuple[str, str]] = []
    attached: dict[str, OpNumerics] = {}
    for name, op in by_node.items():
        if name not in graph_ops:
            unmatched.append((name, "no node of this name in this model"))
        elif graph_ops[name] != op.op:
            unmatched.append((name, f"this model's {name!r} calls {graph_ops[name]}, the compared node {op.op}"))
        elif name not in rows:
            unmatched.append((name, f"{_short_op(op.op)} is not in the report's pattern vocabulary"))
        else:
            attached[name] = op
    if by_node and not any(name in graph_ops and graph_ops[name] == op.op for name, op in by_node.items()):
        listed = ", ".join(list(by_node)[:5]) + (", ..." if len(by_node) > 5 else "")
        raise ValueError(
            f"annotation_report: numerics compared {len(by_node)} op(s) ({listed}) and none is a node of this model; "
            "pass the compare() result of the model converted from this prepared model"
        )
    nodes = tuple(replace(r, numerics=attached[r.node]) if r.node in attached else r for r in reports)
    return AnnotationReport(nodes, numerics_batches=numerics.batches, numerics_unmatched=tuple(unmatched))


def _short_op(target: str) -> str:
    parts = target.split(".")
    return parts[-2] if len(parts) >= 3 else target

"""Accuracy-aware fallback: leave the fewest ops float until the accuracy drop is allowed.

``fallback(model, quantizer, calibration, evaluate, max_drop)`` quantizes ``model`` with
``quantizer``; if ``evaluate`` (higher is better: accuracy, F1...) drops by more than
``max_drop`` from the float model's, it ranks the quantized ops with the numeric debugger
(:func:`quantweave.compare`, worst op SQNR first), leaves them float one unit at a time
in that order until the drop is met, then tries putting each chosen unit back (least
sensitive first) and keeps it quantized when the drop stays met. The result says what was
left float and why (the op's SQNR, the score before and after).

It works with every quantizer, plugin or composition, through public API only:
:class:`LeaveFloat` wraps the quantizer and, after it annotates, removes the annotations
of the chosen nodes (a *unit*: the node and the nodes fused with it, i.e. claimed nodes
joined by an edge that is quantized neither as the producer's output nor as the
consumer's input, such as conv -> relu). References that other nodes' specs make to a
removed spec (``SharedQuantizationSpec``) are replaced by the concrete spec they resolved
to; a ``DerivedQuantizationSpec`` that derives from a removed spec raises ``ValueError``
naming both. With ``float_inputs=True`` (default) a producer whose output is quantized
only for nodes left float loses that output quantization too, so the float ops read float
tensors (otherwise an op left float would still read the coarse tensor that hurt it).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

from ._modules.derive import capabilities_of
from ._modules.foreign import is_pt2e_quantizer, translate_annotations
from .annotation import (
    ANNOTATION_KEY,
    DerivedQuantizationSpec,
    EdgeOrNode,
    QuantizationAnnotation,
    QuantizationSpecBase,
    SharedQuantizationSpec,
    set_skip_reason,
)
from .compose import quantizer_label
from .convert import convert_pt2e
from .numerics import NumericsReport, compare
from .prepare import prepare_pt2e
from .quantizer import Quantizer

__all__ = ["FallbackResult", "FallbackStep", "FloatUnit", "LeaveFloat", "fallback", "fused_units"]


def _annotation(node: Node) -> QuantizationAnnotation | None:
    annotation = node.meta.get(ANNOTATION_KEY)
    return annotation if isinstance(annotation, QuantizationAnnotation) else None


def _claimed(node: Node) -> bool:
    annotation = _annotation(node)
    return annotation is not None and annotation._annotated


def _quantizes_something(node: Node) -> bool:
    annotation = _annotation(node)
    return annotation is not None and (
        annotation.output_qspec is not None or any(s is not None for s in annotation.input_qspec_map.values())
    )


def fused_units(model: GraphModule) -> dict[str, tuple[str, ...]]:
    """For every claimed node of an annotated graph, the names of its unit (graph order):
    claimed nodes joined by edges quantized neither as the producer's output nor as the
    consumer's input (conv -> relu where only relu's output is quantized, conv -> batch
    norm in QAT, ...)."""
    parent: dict[Node, Node] = {}

    def find(node: Node) -> Node:
        while parent.setdefault(node, node) is not node:
            node = parent[node]
        return node

    for consumer in model.graph.nodes:
        annotation = _annotation(consumer)
        if annotation is None or not annotation._annotated:
            continue
        find(consumer)
        for producer in consumer.all_input_nodes:
            produced = _annotation(producer)
            if produced is None or not produced._annotated or produced.output_qspec is not None:
                continue
            if annotation.input_qspec_map.get(producer) is not None:
                continue
            parent[find(consumer)] = find(producer)
    order = {n: i for i, n in enumerate(model.graph.nodes)}
    groups: dict[Node, list[Node]] = {}
    for node in parent:
        groups.setdefault(find(node), []).append(node)
    units: dict[str, tuple[str, ...]] = {}
    for members in groups.values():
        names = tuple(n.name for n in sorted(members, key=order.__getitem__))
        for member in members:
            units[member.name] = names
    return units


class LeaveFloat(Quantizer):
    """``quantizer``, with the nodes named in ``nodes`` (and their fused units) left float.

    After ``quantizer.annotate``, each such node keeps a claimed, empty annotation (later
    quantizers leave it alone) and a skip reason (``reasons[name]``, or a default), which
    :func:`quantweave.annotation_report` shows. Other hooks are forwarded. ``units`` is
    filled on every ``annotate`` with :func:`fused_units` of the graph *before* anything
    was removed.
    """

    def __init__(
        self,
        quantizer: Quantizer,
        nodes: Iterable[str] = (),
        reasons: Mapping[str, str] | None = None,
        float_inputs: bool = True,
    ) -> None:
        if isinstance(quantizer, type) or not (isinstance(quantizer, Quantizer) or is_pt2e_quantizer(quantizer)):
            got = f"the class {quantizer.__name__} itself" if isinstance(quantizer, type) else type(quantizer).__name__
            raise TypeError(
                f"LeaveFloat wraps a quantweave.Quantizer instance; got {got} (an object with the PT2E quantizer "
                "hooks, such as a torchao Quantizer, is taken too)"
            )
        self.quantizer = quantizer
        self.nodes = tuple(dict.fromkeys(nodes))
        self.reasons = dict(reasons or {})
        self.float_inputs = float_inputs
        self.name = quantizer_label(quantizer)
        self.plugin = getattr(quantizer, "plugin", "")
        self.units: dict[str, tuple[str, ...]] = {}
        #: names of producers whose output quantization was removed in the last annotate
        self.float_outputs: tuple[str, ...] = ()

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        return self.quantizer.transform_for_annotation(model)

    def validate(self, model: GraphModule) -> None:
        self.quantizer.validate(model)

    def prepare_obs_or_fq_callback(
        self, model: GraphModule, edge_or_node_to_obs_or_fq: dict[EdgeOrNode, torch.nn.Module]
    ) -> None:
        self.quantizer.prepare_obs_or_fq_callback(model, edge_or_node_to_obs_or_fq)

    def quantization_capabilities(self) -> Sequence[Any]:
        # what the wrapped quantizer declares, or derives by probing when it declares none
        return capabilities_of(self.quantizer)

    def annotate(self, model: GraphModule) -> GraphModule:
        self.quantizer.annotate(model)
        translate_annotations(model.graph, lambda node: self.name)  # a hosted quantizer's (torchao's) classes
        self.units = fused_units(model)
        by_name = {n.name: n for n in model.graph.nodes}
        missing = [name for name in self.nodes if name not in by_name]
        if missing:
            raise ValueError(
                f"LeaveFloat: node(s) {missing} are not in the graph (names of the exported graph's nodes, "
                "as quantweave.compare reports them)"
            )
        chosen: dict[Node, str] = {}
        for name in self.nodes:
            reason = self.reasons.get(name, "left float by quantweave.LeaveFloat")
            for member in self.units.get(name, (name,)):
                chosen.setdefault(by_name[member], reason)
        removed: dict[EdgeOrNode, QuantizationSpecBase] = {}
        for node, reason in chosen.items():
            annotation = _annotation(node)
            if annotation is not None:
                for producer, spec in annotation.input_qspec_map.items():
                    if spec is not None:
                        removed[(producer, node)] = spec
                if annotation.output_qspec is not None:
                    removed[node] = annotation.output_qspec
            node.meta[ANNOTATION_KEY] = QuantizationAnnotation(_annotated=True)
            set_skip_reason(node, reason)
        float_outputs = []
        if self.float_inputs:
            for producer in dict.fromkeys(p for node in chosen for p in node.all_input_nodes):
                annotation = _annotation(producer)
                if producer in chosen or annotation is None or annotation.output_qspec is None:
                    continue
                if all(user in chosen for user in producer.users):
                    removed[producer] = annotation.output_qspec
                    producer.meta[ANNOTATION_KEY] = dataclasses.replace(annotation, output_qspec=None)
                    float_outputs.append(producer.name)
        self.float_outputs = tuple(float_outputs)
        if removed:
            _redirect_references(model, removed)
        return model


def _redirect_references(model: GraphModule, removed: Mapping[EdgeOrNode, QuantizationSpecBase]) -> None:
    """Specs that shared a removed spec get the concrete spec it resolved to; a derived
    spec that derives from one cannot be kept and raises."""

    def current(key: EdgeOrNode) -> QuantizationSpecBase | None:
        if key in removed:
            return removed[key]
        if isinstance(key, Node):
            annotation = _annotation(key)
            return None if annotation is None else annotation.output_qspec
        producer, consumer = key
        annotation = _annotation(consumer)
        return None if annotation is None else annotation.input_qspec_map.get(producer)

    def resolve(spec: QuantizationSpecBase) -> QuantizationSpecBase:
        seen: set[int] = set()
        while isinstance(spec, SharedQuantizationSpec) and id(spec) not in seen:
            seen.add(id(spec))
            target = current(spec.edge_or_node)
            if target is None:
                return spec  # dangling before we touched it: prepare reports it
            spec = target
        return spec

    def fix(spec: QuantizationSpecBase | None, where: str) -> QuantizationSpecBase | None:
        if isinstance(spec, SharedQuantizationSpec) and spec.edge_or_node in removed:
            return resolve(spec)
        if isinstance(spec, DerivedQuantizationSpec):
            gone = [k for k in spec.derived_from if k in removed]
            if gone:
                raise ValueError(
                    f"LeaveFloat: {where} has a DerivedQuantizationSpec derived from "
                    f"{', '.join(_describe(k) for k in gone)}, which is left float; leave {where} float too"
                )
        return spec

    for node in model.graph.nodes:
        annotation = _annotation(node)
        if annotation is None:
            continue
        inputs = {p: fix(s, f"edge {p.name!r} -> {node.name!r}") for p, s in annotation.input_qspec_map.items()}
        output = fix(annotation.output_qspec, f"output of {node.name!r}")
        if output is not annotation.output_qspec or any(
            inputs[p] is not s for p, s in annotation.input_qspec_map.items()
        ):
            node.meta[ANNOTATION_KEY] = dataclasses.replace(annotation, input_qspec_map=inputs, output_qspec=output)


def _describe(key: EdgeOrNode) -> str:
    if isinstance(key, Node):
        return f"the output of {key.name!r}"
    return f"edge {key[0].name!r} -> {key[1].name!r}"


# -- the search ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FloatUnit:
    """Nodes left float together (an op and the nodes fused with it), and why."""

    nodes: tuple[str, ...]
    op: str  # the op of the unit's worst node
    module: str
    sqnr_db: float  # the worst op SQNR in the unit (quantweave.compare, all ops quantized)
    rank: int  # 1 = the debugger's most sensitive unit
    score_without: float  # score when only the units chosen before this one were float
    score_with: float  # score once this unit was left float too
    reason: str


@dataclass(frozen=True)
class FallbackStep:
    """One quantize-calibrate-evaluate trial: which units were float and the score."""

    float_nodes: tuple[str, ...]
    score: float
    action: str


@dataclass(frozen=True)
class FallbackResult:
    """``model``: the converted model with ``left_float`` float; ``met``: whether the drop
    is within ``max_drop``; ``float_outputs``: producers whose output quantization was
    removed because every consumer is float."""

    model: GraphModule
    float_score: float
    quantized_score: float  # every op quantized
    score: float
    max_drop: float
    met: bool
    left_float: tuple[FloatUnit, ...]
    float_outputs: tuple[str, ...]
    steps: tuple[FallbackStep, ...]
    numerics: NumericsReport | None

    @property
    def float_nodes(self) -> tuple[str, ...]:
        return tuple(n for unit in self.left_float for n in unit.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "float_score": self.float_score,
            "quantized_score": self.quantized_score,
            "score": self.score,
            "max_drop": self.max_drop,
            "met": self.met,
            "left_float": [
                {**dataclasses.asdict(u), "sqnr_db": u.sqnr_db if math.isfinite(u.sqnr_db) else str(u.sqnr_db)}
                for u in self.left_float
            ],
            "float_outputs": list(self.float_outputs),
            "steps": [dataclasses.asdict(s) for s in self.steps],
        }

    def summary(self) -> str:
        lines = [
            f"float {self.float_score:.4g}, all quantized {self.quantized_score:.4g}, result {self.score:.4g} "
            f"(allowed drop {self.max_drop:g}: {'met' if self.met else 'NOT met'}); "
            f"{len(self.left_float)} unit(s) left float, {len(self.steps)} trial(s)"
        ]
        for unit in self.left_float:
            lines.append(f"  float: {', '.join(unit.nodes)} -- {unit.reason}")
        if self.float_outputs:
            lines.append(f"  output quantization removed (only float consumers): {', '.join(self.float_outputs)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _batches(data: Iterable[Any]) -> list[tuple[Any, ...]]:
    return [b if isinstance(b, tuple) else (b,) for b in data]


def _score(evaluate: Callable[[GraphModule], float], model: GraphModule, which: str) -> float:
    """``evaluate(model)`` as a float: a real number (int, float, numpy scalar, one-element
    tensor), not NaN. TypeError / ValueError naming ``evaluate`` and what it returned."""
    result = evaluate(model)
    name = getattr(evaluate, "__qualname__", type(evaluate).__name__)
    one_number = isinstance(result, torch.Tensor) and result.numel() == 1 and not result.is_complex()
    if one_number or (isinstance(result, numbers.Real) and not isinstance(result, bool)):
        value = float(result)
    else:
        shown = f"a tensor of shape {tuple(result.shape)}" if isinstance(result, torch.Tensor) else repr(result)
        raise TypeError(
            f"fallback: evaluate ({name}) must return a number (higher is better: accuracy, F1...); on {which} it "
            f"returned {type(result).__name__} {shown}"
        )
    if math.isnan(value):
        raise ValueError(f"fallback: evaluate ({name}) returned NaN on {which}; expected a number to compare")
    return value


def fallback(
    model: GraphModule,
    quantizer: Quantizer,
    calibration: Iterable[Any],
    evaluate: Callable[[GraphModule], float],
    max_drop: float,
    *,
    debug_inputs: Iterable[Any] | None = None,
    max_units: int | None = None,
    float_inputs: bool = True,
) -> FallbackResult:
    """Quantize ``model`` with ``quantizer``, leaving float the fewest units (ranked by
    :func:`quantweave.compare`) needed to keep ``evaluate`` within ``max_drop`` of float.

    ``model``: the exported float GraphModule; ``calibration``: batches (tensors or tuples
    of model arguments) run through every prepared trial; ``evaluate(model) -> float``:
    higher is better, called on the float model and on each converted trial; ``max_drop``:
    the allowed ``float score - quantized score``; ``debug_inputs``: batches for the
    debugger (default: the calibration batches); ``max_units``: stop after leaving this
    many units float (the result then says ``met=False`` if the drop is still too big).
    """
    if not isinstance(model, GraphModule):
        raise TypeError(
            f"fallback: model must be the exported float GraphModule (torch.export(...).module()); "
            f"got {type(model).__name__}"
        )
    if isinstance(quantizer, type) or not (isinstance(quantizer, Quantizer) or is_pt2e_quantizer(quantizer)):
        got = f"the class {quantizer.__name__} itself" if isinstance(quantizer, type) else type(quantizer).__name__
        raise TypeError(
            f"fallback: quantizer must be a quantweave.Quantizer instance; got {got} (an object with the PT2E "
            "quantizer hooks, such as a torchao Quantizer, is taken too)"
        )
    if not callable(evaluate):
        raise TypeError(f"fallback: evaluate must be callable (model -> score); got {type(evaluate).__name__}")
    if not isinstance(max_drop, (int, float)) or max_drop < 0:
        raise ValueError(f"fallback: max_drop must be a number >= 0; got {max_drop!r}")
    batches = _batches(calibration)
    if not batches:
        raise ValueError("fallback: calibration is empty")
    steps: list[FallbackStep] = []
    last_wrapper: list[LeaveFloat] = []

    def quantize(float_units: Sequence[tuple[str, ...]], reasons: Mapping[str, str]) -> GraphModule:
        wrapper = LeaveFloat(quantizer, [u[0] for u in float_units], reasons, float_inputs=float_inputs)
        prepared = prepare_pt2e(model, wrapper)
        with torch.no_grad():
            for batch in batches:
                prepared(*batch)
        last_wrapper[:] = [wrapper]
        return convert_pt2e(prepared)

    def trial(float_units: Sequence[tuple[str, ...]], reasons: Mapping[str, str], action: str) -> tuple[Any, float]:
        converted = quantize(float_units, reasons)
        score = _score(evaluate, converted, f"the quantized model ({action})")
        steps.append(FallbackStep(tuple(n for u in float_units for n in u), score, action))
        return converted, score

    float_score = _score(evaluate, model, "the float model")
    converted, quantized_score = trial([], {}, "all quantized")
    units_of = dict(last_wrapper[0].units)

    def met(score: float) -> bool:
        return float_score - score <= max_drop

    if met(quantized_score):
        return FallbackResult(
            converted, float_score, quantized_score, quantized_score, float(max_drop), True, (), (), tuple(steps), None
        )

    numerics = compare(model, converted, _batches(debug_inputs) if debug_inputs is not None else batches)
    ranked: list[tuple[tuple[str, ...], Any]] = []  # (unit, its worst op's numerics)
    seen: set[tuple[str, ...]] = set()
    for op in numerics.ops:
        unit = units_of.get(op.node, (op.node,))
        if unit not in seen:
            seen.add(unit)
            ranked.append((unit, op))

    chosen: list[tuple[tuple[str, ...], Any, int, float, float]] = []  # unit, op, rank, before, after
    score = quantized_score
    for rank, (unit, op) in enumerate(ranked, start=1):
        if met(score) or (max_units is not None and len(chosen) >= max_units):
            break
        units = [c[0] for c in chosen] + [unit]
        converted, new_score = trial(units, {}, f"leave {unit[0]} float (rank {rank})")
        chosen.append((unit, op, rank, score, new_score))
        score = new_score

    # put back what is not needed, least sensitive first (the last chosen stays: it met the drop)
    if met(score):
        for entry in sorted(chosen[:-1], key=lambda c: -c[2]):
            rest = [c[0] for c in chosen if c is not entry]
            candidate, candidate_score = trial(rest, {}, f"put {entry[0][0]} back (rank {entry[2]})")
            if met(candidate_score):
                chosen.remove(entry)
                converted, score = candidate, candidate_score

    left = tuple(
        FloatUnit(
            nodes=unit,
            op=op.op,
            module=op.module,
            sqnr_db=op.sqnr_db,
            rank=rank,
            score_without=before,
            score_with=after,
            reason=(
                f"op SQNR {op.sqnr_db:.1f} dB at {op.node} (rank {rank} of {len(ranked)} by quantweave.compare); "
                f"leaving it float: score {before:.4g} -> {after:.4g}"
            ),
        )
        for unit, op, rank, before, after in chosen
    )
    # the final model again, with the reasons recorded on its nodes (annotation_report shows them)
    if left:
        reasons = {u.nodes[0]: f"left float by quantweave.fallback: {u.reason}" for u in left}
        converted = quantize([u.nodes for u in left], reasons)
    float_outputs = last_wrapper[0].float_outputs if left else ()
    return FallbackResult(
        converted,
        float_score,
        quantized_score,
        score,
        float(max_drop),
        met(score),
        left,
        float_outputs,
        tuple(steps),
        numerics,
    )

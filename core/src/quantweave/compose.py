"""``ComposableQuantizer``: several quantizers over one graph, first annotator wins.

Members run in order (``transform_for_annotation``, then ``annotate``). A member must
leave alone what an earlier member annotated: replacing, removing *or mutating in place*
an earlier annotation raises :class:`AnnotationConflictError` naming both quantizers and
the node. ``validate`` and ``prepare_obs_or_fq_callback`` are forwarded to every member.
``quantization_capabilities()`` merges the members' declarations by how their patterns
overlap: members claim ops in order, so a member declaring ``conv2d`` claims the conv of
a later member's ``conv2d_add``, which is then shadowed (see
:meth:`ComposableQuantizer.capability_table`; :func:`quantweave.testing.conformance.check_composition`
holds the table against what the members really annotate on the probes).

Which member annotated a node is written into the node's meta
(:data:`~quantweave.annotation.ANNOTATED_BY_KEY`), never kept on the quantizer: one
composed quantizer can prepare any number of models, and each report reads its own graph.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.fx import GraphModule, Node

from ._modules.conflicts import Snapshot, describe_change, snapshot
from ._modules.derive import capabilities_of
from ._modules.foreign import is_annotation_like, translate_annotations
from ._modules.misuse import quantizer_members
from ._modules.patterns import Chain, chain_of, embeddings
from .annotation import ANNOTATED_BY_KEY, ANNOTATION_KEY, EdgeOrNode, QuantizationAnnotation
from .capabilities import Capability, Mode, sort_capabilities
from .errors import AnnotationConflictError
from .quantizer import Quantizer
from .vocabulary import Vocabulary, core_vocabulary

__all__ = ["AnnotationConflictError", "CapabilityRow", "ComposableQuantizer", "quantizer_label"]


def quantizer_label(quantizer: object) -> str:
    """How a quantizer is named in messages and reports: its ``name`` or its class name."""
    name = getattr(quantizer, "name", None)
    return name if isinstance(name, str) and name else type(quantizer).__name__


@dataclass(frozen=True)
class CapabilityRow:
    """Who serves one (pattern, mode) in a composition, and whose declarations it shadows.

    ``served_as`` says, op by op along the pattern (anchor first), which member claims it
    and as which of its own patterns (``None`` where no member does): members annotate in
    order and the first to claim an op keeps it, so a member declaring ``conv2d`` claims
    the conv of ``conv2d_add`` before a later member's ``conv2d_add`` can. ``served_by``
    is the member claiming the anchor (``""`` if none); ``shadowed`` the members that
    declare the pattern but do not serve it as declared; ``capability`` the declaration
    that is served (or, when none is, the first member's)."""

    pattern: str
    mode: Mode
    served_by: str
    shadowed: tuple[str, ...]
    capability: Capability
    served_as: tuple[tuple[str, str] | None, ...] = ()

    @property
    def served_as_declared(self) -> bool:
        """True when one member serves the whole pattern as the pattern it declares."""
        return bool(self.served_as) and all(step == (self.served_by, self.pattern) for step in self.served_as)


_Snapshot = Snapshot


def _value(annotation: Any) -> _Snapshot:
    return snapshot(annotation)


def _changed_fields(before: _Snapshot, after: _Snapshot) -> list[str]:
    names = ("input_qspec_map", "output_qspec", "allow_implicit_sharing", "_annotated")
    return [name for name, a, b in zip(names, before, after, strict=True) if a != b]


def _owner(seen: dict[Node, tuple[Any, Any, str]], label: str, node: Node) -> str:
    """The member that annotated ``node`` (``label``, the member just run, for a new annotation)."""
    return seen[node][2] if node in seen else label


class ComposableQuantizer(Quantizer):
    """Chain quantizers; earlier members have priority over later ones."""

    def __init__(self, quantizers: Sequence[Quantizer]) -> None:
        members = quantizer_members(quantizers, Quantizer)
        if not members:
            raise ValueError("ComposableQuantizer needs at least one quantizer; got an empty sequence")
        labels = [quantizer_label(q) for q in members]
        self.labels = [f"{label}#{i}" if labels.count(label) > 1 else label for i, label in enumerate(labels)]
        self.quantizers = members
        self.name = "+".join(self.labels)

    def __repr__(self) -> str:  # the members, in priority order, each as it prints itself
        return f"{type(self).__name__}([{', '.join(map(repr, self.quantizers))}])"

    def _member_call(self, label: str, member: Quantizer, hook: str, *args: Any) -> Any:
        """Call a member's hook; an exception it raises keeps its class and gets a note
        naming the member."""
        try:
            return getattr(member, hook)(*args)
        except Exception as exc:
            exc.add_note(f"raised by member {label!r} of ComposableQuantizer {self.name!r}")
            raise

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        for member, label in zip(self.quantizers, self.labels, strict=True):
            model = self._member_call(label, member, "transform_for_annotation", model)
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
            if annotation is not None and is_annotation_like(annotation):
                seen[node] = (annotation, _value(annotation), "<pre-existing>")
        for member, label in zip(self.quantizers, self.labels, strict=True):
            self._member_call(label, member, "annotate", model)
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
                after = _value(current) if is_annotation_like(current) else None
                hint = ""
                if not value[3]:
                    hint = (
                        f"; quantizer {owner!r} left _annotated unset on it, so {label!r} could not see it was taken: "
                        f"put {label!r} before {owner!r} in the composition"
                    )
                raise AnnotationConflictError(
                    f"quantizer {label!r} {what} the annotation that quantizer {owner!r} made on node "
                    f"{node.name!r} ({describe_change(value, after)}); a later quantizer must skip nodes an earlier "
                    f"one annotated (check quantweave.plugin_api.is_annotated){hint}"
                )
            # a hosted (torchao) member's annotations, also through a wrapper: later members read and
            # write quantweave's classes (translation leaves quantweave's own annotations as they are)
            if translate_annotations(model.graph, functools.partial(_owner, seen, label)):
                for node, (annotation, _, owner) in list(seen.items()):
                    current = node.meta.get(ANNOTATION_KEY)
                    if current is not annotation and current is not None:
                        seen[node] = (current, _value(current), owner)
            for node in model.graph.nodes:
                annotation = node.meta.get(ANNOTATION_KEY)
                if annotation is not None and node not in seen and is_annotation_like(annotation):
                    seen[node] = (annotation, _value(annotation), label)
                    if not isinstance(member, ComposableQuantizer) or ANNOTATED_BY_KEY not in node.meta:
                        node.meta[ANNOTATED_BY_KEY] = label  # a nested composition names its own members
        return model

    def validate(self, model: GraphModule) -> None:
        for member, label in zip(self.quantizers, self.labels, strict=True):
            self._member_call(label, member, "validate", model)

    def prepare_obs_or_fq_callback(
        self, model: GraphModule, edge_or_node_to_obs_or_fq: dict[EdgeOrNode, torch.nn.Module]
    ) -> None:
        for member, label in zip(self.quantizers, self.labels, strict=True):
            self._member_call(label, member, "prepare_obs_or_fq_callback", model, edge_or_node_to_obs_or_fq)

    def capability_table(self, vocabulary: Vocabulary | None = None) -> list[CapabilityRow]:
        """One row per declared (pattern, mode), computed from the patterns the members
        declare and how they overlap (see :class:`CapabilityRow`). A member that declares
        none (its class does not define ``quantization_capabilities``, e.g. a vendor's
        torchao quantizer) takes part with the capabilities probing derives
        (:func:`quantweave.capabilities.derive_capabilities`). A pattern probed behind a
        producer (``PatternSpec.producer`` in ``vocabulary``, default the core's) is claimed
        after that producer's ops."""
        vocabulary = core_vocabulary() if vocabulary is None else vocabulary
        declared: list[tuple[str, Capability]] = []  # (member label, capability), in member order
        for member, label in zip(self.quantizers, self.labels, strict=True):
            for cap in capabilities_of(member):  # a member declaring none: derived by probing
                if not isinstance(cap, Capability):
                    raise TypeError(
                        f"quantizer {label!r}: quantization_capabilities() must return Capability records; "
                        f"got {type(cap).__name__}"
                    )
                if not cap.quantizer:
                    cap = replace(cap, quantizer=label)
                plugin = getattr(member, "plugin", "")
                if not cap.plugin and plugin:
                    cap = replace(cap, plugin=plugin)
                declared.append((label, cap))
        rows = []
        for key in dict.fromkeys(cap.key for _, cap in declared):
            pattern, mode = key
            own = [(label, cap) for label, cap in declared if cap.key == key]
            context = chain_of(vocabulary.producer_ops(pattern))
            claims = self._claims(
                context + chain_of(own[0][1].ops), [(lb, c) for lb, c in declared if c.mode is mode], pattern
            )
            steps = claims[len(context) :]
            served_by = steps[0][0] if steps and steps[0] is not None else ""
            serving = next(((lb, c) for lb, c in own if all(step == (lb, pattern) for step in steps)), None)
            shadowed = tuple(lb for lb, _ in own if serving is None or lb != serving[0])
            capability = serving[1] if serving is not None else own[0][1]
            rows.append(CapabilityRow(pattern, mode, served_by, tuple(dict.fromkeys(shadowed)), capability, steps))
        return sorted(rows, key=lambda r: (r.pattern, r.mode.value))

    def _claims(
        self, chain: Chain, declared: list[tuple[str, Capability]], pattern: str = ""
    ) -> tuple[tuple[str, str] | None, ...]:
        """Who claims each step of ``chain``: members in order, each member's longest
        patterns first, a pattern claiming only steps still free; a pattern that depends on
        its producer (``input_from``) claims only after a step its own member (``"own"``) or
        any member (``"any"``) claimed."""
        claims: list[tuple[str, str] | None] = [None] * len(chain)
        for label in self.labels:
            # a member serves the row's own pattern before another of its patterns that fits the
            # same ops (conv2d_hardtanh fits conv2d_relu6, whose relu6 may export as hardtanh)
            mine = sorted(
                (c for lb, c in declared if lb == label and c.ops),
                key=lambda c: (c.pattern != pattern, -len(chain_of(c.ops))),
            )
            # one claim at a time, then from the member's first pattern again: a claim may let
            # a producer-dependent pattern claim the step after it, and the row's own pattern
            # (first) must get it before another of the member's patterns listed later
            while self._claim_one(label, mine, chain, claims):
                pass
        return tuple(claims)

    @staticmethod
    def _claim_one(label: str, mine: list[Capability], chain: Chain, claims: list[tuple[str, str] | None]) -> bool:
        """Claims the first free occurrence of the first of ``mine`` that fits ``chain``
        (a producer-dependent pattern only after its producer); whether one was claimed."""
        for cap in mine:
            inner = chain_of(cap.ops)
            for offset in embeddings(inner, chain):
                span = range(offset, offset + len(inner))
                if any(claims[i] is not None for i in span):
                    continue
                before = claims[offset - 1] if offset > 0 else None
                if cap.input_from == "own" and (before is None or before[0] != label):
                    continue
                if cap.input_from == "any" and before is None:
                    continue
                for i in span:
                    claims[i] = (label, cap.pattern)
                return True
        return False

    def quantization_capabilities(self) -> list[Capability]:
        """What the composition delivers: each pattern a member serves as it declares it,
        with provenance (a pattern whose ops earlier members claim is not listed)."""
        return sort_capabilities(row.capability for row in self.capability_table() if row.served_as_declared)

"""Pattern specs and the :class:`Vocabulary` that holds them.

A :class:`PatternSpec` names one pattern: its ops (a chain, anchor first), the pattern that
feeds its anchor in its probe (``producer``) and a probe factory (a small model containing
one instance of the pattern, and its example inputs). A :class:`Vocabulary` is the set of
patterns in force -- the core's (:func:`quantweave.vocabulary.core_vocabulary`) plus those
loaded plugins contribute -- and the one place that answers the questions capabilities,
composition, the report and the conformance kit ask about patterns: their ops, their
producer's ops, where they occur in a graph, and their probe exported.

Probes are exported (``torch.export``, non-strict, ``.module(check_guards=False)``) once per
process per (pattern, probe factory, training mode, input shapes) and handed out as deep
copies: whatever a quantizer does to its copy (annotations, rewrites, parameters) never
reaches the next caller.
"""

from __future__ import annotations

import copy
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch.fx import Graph, GraphModule, Node

from .._modules.patterns import chain_of, matches
from .._modules.torch_compat import unguarded_module

__all__ = [
    "OP_NAME",
    "PATTERN_NAME",
    "ExportedProbe",
    "PatternSpec",
    "ProbeFactory",
    "Vocabulary",
    "export_probe",
    "forget_exported_probes",
]

PATTERN_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+$")

#: A probe: a factory of (model, example inputs) containing one instance of a pattern.
ProbeFactory = Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]


@dataclass(frozen=True)
class PatternSpec:
    """One pattern of the vocabulary: a name, what it is, the aten ops that anchor it
    (the first is the anchor the conformance kit checks), and a probe model factory.

    Core patterns have ``origin="core"``; a plugin contributes its own through the
    ``quantweave_patterns`` hook (plugin API 2) and the registry sets ``origin`` to the
    plugin's name. Ops are written ``"<namespace>.<op>.<overload>"`` (``"aten.conv3d.default"``).
    ``producer`` names the pattern that feeds the anchor in the probe (``"conv2d"`` for the
    pooling and shape ops, which backends quantize only after a quantized producer).
    """

    name: str
    description: str
    ops: tuple[str, ...]
    probe: ProbeFactory | None = field(default=None, compare=False)
    origin: str = "core"
    producer: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not PATTERN_NAME.match(self.name):
            raise ValueError(
                f"PatternSpec: name must be lower-case letters, digits and '_', starting with a letter; "
                f"got {self.name!r}"
            )
        ops = tuple(self.ops) if isinstance(self.ops, (list, tuple)) else None
        if not ops or not all(isinstance(op, str) and OP_NAME.match(op) for op in ops):
            raise ValueError(
                f"PatternSpec {self.name!r}: ops must be a non-empty sequence of op names like "
                f"'aten.conv3d.default'; got {self.ops!r}"
            )
        object.__setattr__(self, "ops", ops)
        if self.probe is not None and not callable(self.probe):
            raise ValueError(f"PatternSpec {self.name!r}: probe must be a callable; got {self.probe!r}")

    @property
    def anchor(self) -> str:
        return self.ops[0]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "ops": list(self.ops), "origin": self.origin}


class ExportedProbe(NamedTuple):
    """A probe exported: the graph module (a copy of its own) and example inputs (clones)."""

    graph_module: GraphModule
    inputs: tuple[Any, ...]


_LOCK = threading.RLock()
_EXPORTS: dict[tuple[Any, ...], tuple[GraphModule, tuple[Any, ...]]] = {}


def _shapes(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else repr(x) for x in inputs)


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


def export_probe(spec: PatternSpec, train: bool = False) -> ExportedProbe:
    """``spec``'s probe, built with seed 0, put in training mode or not, exported: exported
    once per process per (pattern, probe factory, mode, input shapes) and handed out as a
    copy (graph module deep-copied, inputs cloned)."""
    if spec.probe is None:
        raise ValueError(f"pattern {spec.name!r} (from {spec.origin!r}) has no probe to export")
    with _LOCK:
        torch.manual_seed(0)
        model, inputs = spec.probe()
        inputs = tuple(inputs)
        key = (spec.name, spec.probe, bool(train), _shapes(inputs))
        if key not in _EXPORTS:
            model.train(train)
            _EXPORTS[key] = (unguarded_module(torch.export.export(model, inputs)), inputs)
        gm, stored = _EXPORTS[key]
        with warnings.catch_warnings():  # torch's pytree warns about its own LeafSpec when copied
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            copied = copy.deepcopy(gm)
        return ExportedProbe(copied, tuple(_clone(x) for x in stored))


def forget_exported_probes() -> None:
    """Drop every exported probe (the next request exports again); for tests."""
    with _LOCK:
        _EXPORTS.clear()


class Vocabulary(Mapping[str, PatternSpec]):
    """The patterns in force, by name (a read-only mapping name -> :class:`PatternSpec`),
    with what callers ask of them."""

    def __init__(self, patterns: Mapping[str, PatternSpec] | Iterable[PatternSpec] = ()) -> None:
        items = patterns.values() if isinstance(patterns, Mapping) else patterns
        self._specs: dict[str, PatternSpec] = {}
        for spec in items:
            if not isinstance(spec, PatternSpec):
                raise TypeError(f"Vocabulary: expected PatternSpec items; got {type(spec).__name__}")
            self._specs[spec.name] = spec

    def __getitem__(self, name: str) -> PatternSpec:
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        origins = sorted({s.origin for s in self._specs.values()})
        return f"Vocabulary({len(self)} patterns from {', '.join(origins) or 'nowhere'})"

    def with_patterns(self, extra: Mapping[str, PatternSpec] | None) -> Vocabulary:
        """This vocabulary with ``extra`` added (an ``extra`` pattern replaces one of the
        same name)."""
        if not extra:
            return self
        return Vocabulary({**self._specs, **dict(extra)})

    def ops(self, name: str) -> tuple[str, ...]:
        """The ops of pattern ``name`` (empty when it is not in the vocabulary)."""
        spec = self._specs.get(name)
        return spec.ops if spec is not None else ()

    def producer_ops(self, name: str) -> tuple[str, ...]:
        """The ops of the pattern feeding ``name``'s anchor in its probe (empty if none)."""
        spec = self._specs.get(name)
        return self.ops(spec.producer) if spec is not None and spec.producer else ()

    def all_ops(self) -> frozenset[str]:
        """Every op some pattern names."""
        return frozenset(op for spec in self._specs.values() for op in spec.ops)

    @staticmethod
    def occurrences(
        graph: Graph, ops: tuple[str, ...], users: Callable[[Node], Iterable[Node]] | None = None
    ) -> list[tuple[Node, ...]]:
        """Every occurrence of the chain ``ops`` in ``graph`` (one node per step, each a user
        of the one before; ``users`` says who reads a node, e.g. looking through observers)."""
        return matches(graph, chain_of(ops), users)

    def exported(self, name: str, train: bool = False) -> ExportedProbe:
        """The probe of ``name`` exported (see :func:`export_probe`): a copy of its own."""
        return export_probe(self._specs[name], train)

"""A cache of exported conformance probes, one per test session (fixture ``quantweave_probes``).

Exporting a probe (``torch.export``) costs far more than annotating it, so every test and
every quantizer of a session gets copies of one export per (pattern, mode): a test may
annotate, prepare or convert its copy without changing what the next test gets. Where the
core exports probes once per process itself (``quantweave.vocabulary.export_probe``), the
cache takes its exports from there, so the kit's checks and the fixture share one export.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.fx import GraphModule

from quantweave.plugin_api import Mode
from quantweave.vocabulary import PatternSpec, core_patterns

__all__ = ["Probe", "ProbeCache"]


@dataclass(frozen=True)
class Probe:
    """One exported probe: the float model, its example inputs and the exported graph module."""

    pattern: str
    mode: Mode
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    graph_module: GraphModule


class ProbeCache:
    """Exports each vocabulary probe once and hands out copies.

    ``patterns``: patterns a plugin contributes (name -> ``PatternSpec`` with a probe),
    beyond the core vocabulary."""

    def __init__(self, patterns: Mapping[str, PatternSpec] | None = None) -> None:
        self._patterns = dict(patterns or {})
        self._cache: dict[tuple[str, Mode], Probe] = {}
        #: how many probes were exported (torch.export) so far
        self.exports = 0

    def vocabulary(self) -> dict[str, PatternSpec]:
        """The core vocabulary and the patterns given to the cache, by name."""
        return {**core_patterns(), **self._patterns}

    def add_patterns(self, patterns: Mapping[str, PatternSpec]) -> None:
        """Make a plugin's contributed patterns known (a name already cached keeps its export)."""
        self._patterns.update(patterns)

    def get(self, pattern: str, mode: Mode | str = Mode.STATIC) -> Probe:
        """A copy of the exported probe of ``pattern`` (model put in train mode for QAT).
        ``exports`` counts the (pattern, mode) pairs this cache had exported."""
        mode = Mode(mode)
        key = (pattern, mode)
        if key not in self._cache:
            spec = self.vocabulary().get(pattern)
            if spec is None:
                raise KeyError(
                    f"no pattern {pattern!r} in the vocabulary (core patterns and the patterns given to the cache); "
                    f"known: {', '.join(sorted(self.vocabulary()))}"
                )
            if spec.probe is None:
                raise KeyError(f"pattern {pattern!r} has no probe (PatternSpec.probe is None)")
            torch.manual_seed(0)
            model, inputs = spec.probe()
            model.train(mode is Mode.QAT)
            exported, inputs = _export(spec, model, tuple(inputs), mode is Mode.QAT)
            self.exports += 1
            self._cache[key] = Probe(pattern, mode, model, inputs, exported)
        probe = self._cache[key]
        with warnings.catch_warnings():  # torch's pytree warns about its own LeafSpec when copied
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            return Probe(
                pattern,
                mode,
                copy.deepcopy(probe.model),
                tuple(t.clone() for t in probe.inputs),
                copy.deepcopy(probe.graph_module),
            )

    def __len__(self) -> int:
        return len(self._cache)

    def __repr__(self) -> str:
        return f"ProbeCache({len(self._cache)} exported probes, {self.exports} exports)"


def _export(
    spec: PatternSpec, model: nn.Module, inputs: tuple[torch.Tensor, ...], train: bool
) -> tuple[GraphModule, tuple[torch.Tensor, ...]]:
    """The exported probe: from the core's per-process export cache when it has one."""
    try:
        from quantweave.vocabulary import export_probe  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        exported = torch.export.export(model, inputs).module()
        assert isinstance(exported, GraphModule)
        return exported, inputs
    graph_module, stored = export_probe(spec, train)
    return graph_module, tuple(stored)

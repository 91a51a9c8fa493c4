"""The pattern vocabulary: every pattern, its ops, the pattern feeding it and its probe.

One home for what capabilities, composition, the annotation report and the conformance kit
say about patterns. This package only re-exports:

- :mod:`.spec`: :class:`PatternSpec` (one pattern), :class:`Vocabulary` (the patterns in
  force, and what is asked of them), probes exported once per process (:func:`export_probe`);
- :mod:`.core`: the core patterns (:data:`PATTERNS`, :data:`PRODUCERS`,
  :func:`core_vocabulary`), registered through the ``quantweave_patterns`` hook like a
  plugin's;
- :mod:`.probes`: the core probe models (:data:`PROBES`, :func:`sweep_probe`).

A registry's vocabulary (core and contributed patterns) is
``quantweave.registry.PluginManager.vocabulary()``.
"""

from .core import PATTERNS, PRODUCERS, core_patterns, core_vocabulary
from .probes import PROBES, sweep_probe
from .spec import ExportedProbe, PatternSpec, ProbeFactory, Vocabulary, export_probe, forget_exported_probes

__all__ = [
    "PATTERNS",
    "PROBES",
    "PRODUCERS",
    "ExportedProbe",
    "PatternSpec",
    "ProbeFactory",
    "Vocabulary",
    "core_patterns",
    "core_vocabulary",
    "export_probe",
    "forget_exported_probes",
    "sweep_probe",
]

"""Declared capabilities: which patterns a quantizer supports, in which mode, with which dtypes.

A :class:`Capability` is one record per (pattern, mode). Patterns are named from the pattern
vocabulary (:mod:`quantweave.vocabulary`: the core's, and those plugins contribute), so
declarations from different plugins can be compared and merged. Records are frozen, ordered
and JSON-serialisable (:meth:`Capability.to_dict` / :meth:`Capability.from_dict`).

A graph node counts as the op it computes (:func:`vocabulary_op`): an in-place op
(``aten.relu_.default``) as its functional op, a convolution with a string padding
(``aten.conv2d.padding``) as the convolution; patterns name the functional ops only.

Capabilities are *tested truths*: ``quantweave.testing.conformance`` builds a probe model
for every declared pattern, runs the quantizer, and fails when what is annotated differs
from what is declared.

The records are defined in ``quantweave._modules.records`` (below the derivation by probing,
which this module calls); import them from here or from :mod:`quantweave.plugin_api`.
``PATTERNS``, ``PROBE_PRODUCERS`` and ``core_patterns`` moved to :mod:`quantweave.vocabulary`
(``PATTERNS``, ``PRODUCERS``, ``core_patterns``); the old names still work and warn.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import vocabulary as _vocabulary
from ._modules.patterns import vocabulary_op
from ._modules.records import (
    FLOAT,
    Capability,
    Mode,
    Quant,
    TensorQuant,
    capability_sort_key,
    sort_capabilities,
    tensor_quant_from_spec,
)
from .vocabulary import PRODUCERS as PROBE_PRODUCERS  # the old name, kept (undocumented, so no warning)
from .vocabulary import PatternSpec, ProbeFactory

__all__ = [
    "FLOAT",
    "Capability",
    "Mode",
    "PROBE_PRODUCERS",
    "PatternSpec",
    "ProbeFactory",
    "Quant",
    "TensorQuant",
    "capability_sort_key",
    "derive_capabilities",
    "sort_capabilities",
    "tensor_quant_from_spec",
    "vocabulary_op",
]

#: documented names that moved to quantweave.vocabulary (old name -> new name); they warn
_MOVED = {"PATTERNS": "PATTERNS", "core_patterns": "core_patterns"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        new = _MOVED[name]
        warnings.warn(
            f"quantweave.capabilities.{name} moved to quantweave.vocabulary.{new}; the old name goes in the "
            "next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_vocabulary, new)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def derive_capabilities(quantizer: object) -> tuple[Capability, ...]:
    """Capabilities of a quantizer that declares none (any object with the PT2E hooks),
    read off what it annotates on the conformance probes; cached per configuration; each
    record has ``source="derived"`` (see :mod:`quantweave._modules.derive`)."""
    from ._modules.derive import derive_capabilities as derive  # torch.export and the probes, on first use

    return derive(quantizer)

"""pytest-quantweave: quantweave's conformance kit as a pytest plugin.

One line in a plugin's test file runs the whole kit, one test per declared capability::

    from pytest_quantweave import conformance_suite

    TestConformance = conformance_suite("quantweave_acme.plugin")  # or the entry-point name "acme"

The plugin (entry point ``pytest11``: ``quantweave``) also offers fixtures for tests of
one's own (``quantweave_plugin``, ``quantweave_quantizer_info``, ``quantweave_quantizer``,
``quantweave_capability``, ``quantweave_probes``), see README.md. The distribution also
carries the reference models, the digits data loader and the reference quantizer that
quantweave's own tests, benchmarks and examples use (``pytest_quantweave.models``,
``.digits``, ``.reference``; importable as ``quantweave.testing.models`` etc. too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

#: The distribution's version (single source: pyproject.toml reads it from here).
__version__ = "0.1.0"

__all__ = [
    "CapabilityCase",
    "PluginConformance",
    "PluginUnderTest",
    "Probe",
    "ProbeCache",
    "conformance_suite",
    "load_plugin",
]

if TYPE_CHECKING:
    from .probes import Probe, ProbeCache
    from .suite import CapabilityCase, PluginConformance, PluginUnderTest, conformance_suite, load_plugin

# Lazy, so that `import pytest_quantweave.models` (reference models for examples and
# benchmarks) imports neither pytest nor the conformance kit.
_HOMES = {
    "Probe": "probes",
    "ProbeCache": "probes",
    "CapabilityCase": "suite",
    "PluginConformance": "suite",
    "PluginUnderTest": "suite",
    "conformance_suite": "suite",
    "load_plugin": "suite",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pytest_quantweave' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{home}", __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])

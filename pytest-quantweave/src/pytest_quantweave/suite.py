"""The plugin under test, its capability cases, and the conformance suite class.

Everything here calls the public functions of ``quantweave.testing.conformance``
(``check_capability``, ``check_conformance``); the suite only arranges them as pytest
items: one per declared capability, one per quantizer, one for loading the plugin.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest

from quantweave.capabilities import Capability, PatternSpec
from quantweave.plugin_api import PROJECT, QuantizerInfo
from quantweave.testing.conformance import ConformanceFailure, check_capability, check_conformance

__all__ = ["CapabilityCase", "PluginConformance", "PluginUnderTest", "conformance_suite", "load_plugin"]

#: The marker that names the plugin under test (also an ini option and a class attribute).
MARKER = "quantweave_plugin"


@dataclass(frozen=True)
class PluginUnderTest:
    """A plugin loaded into a fresh plugin manager, as quantweave's registry would load it."""

    spec: str  # what the test named: an entry-point name or "module[:attribute]"
    name: str  # the plugin's name (its entry-point name when it has one)
    plugin: object | None  # the module / object whose hooks were registered
    infos: dict[str, QuantizerInfo] = field(default_factory=dict)  # quantizer name -> its declaration
    patterns: dict[str, PatternSpec] = field(default_factory=dict)  # the patterns it contributes
    error: str = ""  # why it did not load ("" when it did)

    def require_loaded(self) -> None:
        """Fail the running test, saying why, if the plugin did not load."""
        if self.error:
            pytest.fail(f"quantweave plugin {self.name!r} ({self.spec}) did not load: {self.error}", pytrace=False)


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=PROJECT))


def load_plugin(spec: object, name: str | None = None) -> PluginUnderTest:
    """Import and register the plugin ``spec`` names: an installed entry-point name of the
    ``quantweave`` group (``"acme"``), a module path (``"quantweave_acme.plugin"``), a
    ``"module:attribute"`` path, or the plugin module / object itself. ``name``: the plugin's
    name in reports (default: its entry-point name, else the module path)."""
    from quantweave.registry import PluginManager

    label: str = spec if isinstance(spec, str) else str(getattr(spec, "__name__", repr(spec)))
    plugin: object | None
    if isinstance(spec, str) and not spec:
        return PluginUnderTest(spec, name or "?", None, error="the plugin under test is named by an empty string")
    found = [ep for ep in _entry_points() if ep.name == spec] if isinstance(spec, str) else []
    if found:
        try:
            plugin = found[0].load()
        except Exception as exc:
            return PluginUnderTest(label, name or found[0].name, None, error=f"entry point {found[0].value}: {exc!r}")
        label = found[0].value
        name = name or found[0].name
    elif isinstance(spec, str):
        module, _, attribute = spec.partition(":")
        try:
            plugin = importlib.import_module(module)
            for part in filter(None, attribute.split(".")):
                plugin = getattr(plugin, part)
        except Exception as exc:
            error = f"cannot import {spec!r}: {exc!r}"
            if "." not in spec and ":" not in spec:
                installed = ", ".join(sorted(ep.name for ep in _entry_points())) or "none"
                error = (
                    f"{spec!r} is neither an installed entry point of the group {PROJECT!r} (installed: {installed}) "
                    f"nor an importable module ({exc!r}); install the plugin (pip install -e .) or name its module, "
                    "e.g. 'quantweave_acme.plugin'"
                )
            return PluginUnderTest(spec, name or spec, None, error=error)
        if name is None:
            owners = [ep.name for ep in _entry_points() if ep.value == spec]
            name = owners[0] if owners else spec
    else:
        plugin = spec
        name = name or label
    manager = PluginManager(entry_points=[], strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record = manager.register(name, plugin)
    if record.status != "loaded":
        return PluginUnderTest(label, name, plugin, error=f"{record.status}: {record.error}")
    contributed = {n: p for n, p in manager.patterns().items() if p.origin == name}
    infos = {info.name: info for info in manager.quantizer_infos().values()}
    return PluginUnderTest(label, name, plugin, infos, contributed)


@dataclass(frozen=True)
class CapabilityCase:
    """One declared capability of one quantizer of the plugin under test."""

    plugin: PluginUnderTest
    info: QuantizerInfo
    capability: Capability

    @property
    def id(self) -> str:
        return f"{self.info.name}-{self.capability.pattern}-{self.capability.mode.value}"

    def failures(self) -> list[ConformanceFailure]:
        """``check_capability`` on this capability (empty: delivered as declared)."""
        return check_capability(self.info, self.capability, self.plugin.name, self.plugin.patterns)


def _raise(failures: list[ConformanceFailure]) -> None:
    __tracebackhide__ = True  # the report shows the failures, not the kit's frames
    if failures:
        raise AssertionError(f"{len(failures)} conformance failure(s):\n" + "\n".join(f"  - {f}" for f in failures))


class PluginConformance:
    """The conformance kit as test items. Use :func:`conformance_suite` (one line), or
    subclass it as ``class TestConformance(PluginConformance): quantweave_plugin = "acme"``."""

    #: the plugin under test (entry-point name, module path or object); a
    #: ``@pytest.mark.quantweave_plugin(...)`` or the ini option ``quantweave_plugin`` also names it
    quantweave_plugin: Any = None

    def test_the_plugin_loads(self, quantweave_plugin: PluginUnderTest) -> None:
        """It registers in a fresh plugin manager (plugin API supported, hooks valid) and
        provides at least one quantizer."""
        quantweave_plugin.require_loaded()
        assert quantweave_plugin.infos, f"plugin {quantweave_plugin.name!r} provides no quantizer"

    def test_each_declared_capability_is_delivered(self, quantweave_capability: CapabilityCase) -> None:
        """The capability's pattern, annotated on its probe, has every declared field, and
        the probe prepares, converts and runs (one item per declared capability)."""
        _raise(quantweave_capability.failures())

    def test_the_quantizer_annotates_only_what_it_declares(
        self, quantweave_plugin: PluginUnderTest, quantweave_quantizer_info: QuantizerInfo
    ) -> None:
        """Nothing undeclared is annotated on any probe of the vocabulary or the sweep model,
        and the registry's declaration agrees with each configured instance's
        ``quantization_capabilities()`` (failures of declared capabilities are reported by
        their own items above)."""
        info = quantweave_quantizer_info
        declared = {(c.pattern, c.mode.value) for c in info.capabilities}
        failures = check_conformance(info, quantweave_plugin.name, quantweave_plugin.patterns)
        _raise([f for f in failures if (f.pattern, f.mode) not in declared])

    def test_the_installed_entry_point_loads_the_plugin(self, quantweave_plugin: PluginUnderTest) -> None:
        """When the plugin is installed, quantweave's own registry loads it from its entry
        point with the same quantizers (skipped when it is not installed)."""
        quantweave_plugin.require_loaded()
        if not any(ep.name == quantweave_plugin.name for ep in _entry_points()):
            pytest.skip(f"no entry point {quantweave_plugin.name!r} is installed (pip install . first)")
        import quantweave as qw

        records = [r for r in qw.plugins() if r.name == quantweave_plugin.name]
        assert records, f"quantweave.plugins() does not list {quantweave_plugin.name!r}"
        assert records[0].status == "loaded", records[0].error
        assert set(records[0].quantizers) == set(quantweave_plugin.infos)


def conformance_suite(plugin: object, name: str | None = None) -> type:
    """The conformance suite for ``plugin`` as a test class: assign it to a ``Test*`` name
    in a test module and pytest collects it, e.g.
    ``TestConformance = conformance_suite("quantweave_acme.plugin")``.

    ``plugin``: an installed entry-point name (``"acme"``), a module path, a
    ``"module:attribute"`` path, or the plugin module itself. ``name``: the plugin's name in
    reports (default: its entry-point name)."""
    marker = getattr(pytest.mark, MARKER)(plugin, name=name)
    label = plugin if isinstance(plugin, str) else getattr(plugin, "__name__", "plugin")
    return type(
        "TestConformance",
        (PluginConformance,),
        {"pytestmark": [marker], "__doc__": f"quantweave's conformance kit on {label}."},
    )

"""The pytest plugin (entry point ``pytest11``: ``quantweave``).

Adds, and changes nothing else:

* the marker ``@pytest.mark.quantweave_plugin(PLUGIN, name=None)`` and the ini option
  ``quantweave_plugin``: which quantweave plugin a test module / class / function tests
  (an entry-point name, a module path or ``module:attribute``; the closest marker wins,
  then a test class's ``quantweave_plugin`` attribute, then the ini option);
* fixtures: ``quantweave_plugin`` (the loaded plugin, :class:`~pytest_quantweave.PluginUnderTest`),
  ``quantweave_quantizer_info`` (one test per quantizer it provides), ``quantweave_quantizer``
  (one per quantizer and declared mode: a configured instance), ``quantweave_capability``
  (one per declared capability: a :class:`~pytest_quantweave.CapabilityCase`, ids
  ``quantizer-pattern-mode``), and ``quantweave_probes`` (session scope: exported probes,
  each exported once per session, handed out as copies).

quantweave and torch are imported only when one of these fixtures is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .probes import ProbeCache
    from .suite import PluginUnderTest

MARKER = "quantweave_plugin"
_PARAMETRIZED = ("quantweave_capability", "quantweave_quantizer_info", "quantweave_quantizer")
_LOADED = pytest.StashKey[dict[tuple[Any, Any], "PluginUnderTest"]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        MARKER,
        "the quantweave plugin under test (entry-point name, module path or module:attribute) for tests "
        "that use the quantweave_* fixtures without a quantweave_plugin marker",
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(plugin, name=None): the quantweave plugin the quantweave_* fixtures test (an entry-point name, a "
        "module path or module:attribute, or the plugin module); see pytest-quantweave's README",
    )
    config.stash[_LOADED] = {}


def _named(node: Any, cls: type | None, config: pytest.Config) -> tuple[Any, str | None]:
    marker = node.get_closest_marker(MARKER)
    if marker is not None:
        if not marker.args:
            raise pytest.UsageError(
                f"{node.nodeid}: @pytest.mark.{MARKER}() needs the plugin, e.g. @pytest.mark.{MARKER}('acme')"
            )
        return marker.args[0], marker.kwargs.get("name")
    attribute = getattr(cls, MARKER, None) if cls is not None else None
    if attribute is not None:
        return attribute, None
    ini = str(config.getini(MARKER) or "").strip()
    if ini:
        return ini, None
    raise pytest.UsageError(
        f"{node.nodeid} uses a quantweave_* fixture but names no quantweave plugin: add "
        f"@pytest.mark.{MARKER}('acme') (entry-point name or module path), a class attribute {MARKER} = 'acme', "
        f"or the ini option {MARKER} = acme"
    )


def _load(config: pytest.Config, spec: Any, name: str | None) -> PluginUnderTest:
    from .suite import load_plugin

    loaded = config.stash[_LOADED]
    key = (spec if isinstance(spec, str) else id(spec), name)
    if key not in loaded:
        loaded[key] = load_plugin(spec, name)
    return loaded[key]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    wanted = [f for f in _PARAMETRIZED if f in metafunc.fixturenames]
    if not wanted:
        return
    plugin = _load(metafunc.config, *_named(metafunc.definition, metafunc.cls, metafunc.config))
    for fixture in wanted:
        if plugin.error:
            values: list[Any] = [pytest.param(plugin, id=f"{plugin.name}-did-not-load")]
        elif fixture == "quantweave_capability":
            from .suite import CapabilityCase

            cases = [CapabilityCase(plugin, info, cap) for info in plugin.infos.values() for cap in info.capabilities]
            values = [pytest.param(case, id=case.id) for case in cases]
        elif fixture == "quantweave_quantizer_info":
            values = [pytest.param(info, id=info.name) for info in plugin.infos.values()]
        else:
            modes = [
                (info, mode)
                for info in plugin.infos.values()
                for mode in sorted({c.mode for c in info.capabilities}, key=lambda m: m.value)
            ]
            values = [pytest.param(pair, id=f"{pair[0].name}-{pair[1].value}") for pair in modes]
        metafunc.parametrize(fixture, values, indirect=True)


def _param(request: pytest.FixtureRequest) -> Any:
    from .suite import PluginUnderTest

    value = request.param
    if isinstance(value, PluginUnderTest):
        value.require_loaded()
    return value


@pytest.fixture
def quantweave_plugin(request: pytest.FixtureRequest) -> PluginUnderTest:
    """The quantweave plugin under test, loaded into a fresh plugin manager (``.name``,
    ``.infos``: quantizer name -> QuantizerInfo, ``.patterns``: the patterns it contributes,
    ``.error``: why it did not load, "" when it did)."""
    return _load(request.config, *_named(request.node, request.cls, request.config))


@pytest.fixture
def quantweave_quantizer_info(request: pytest.FixtureRequest) -> Any:
    """Each quantizer the plugin provides (its ``QuantizerInfo``), one test each."""
    return _param(request)


@pytest.fixture
def quantweave_quantizer(request: pytest.FixtureRequest) -> Any:
    """A configured instance of each quantizer, in each mode it declares
    (``factory(**mode_options[mode])``), one test each (ids ``quantizer-mode``)."""
    info, mode = _param(request)
    return info.factory(**info.options_for(mode))


@pytest.fixture
def quantweave_capability(request: pytest.FixtureRequest) -> Any:
    """Each declared capability of each quantizer, one test each (ids
    ``quantizer-pattern-mode``): ``.info``, ``.capability``, ``.failures()`` (the kit's
    ``check_capability``)."""
    return _param(request)


@pytest.fixture(scope="session")
def quantweave_probes() -> ProbeCache:
    """Exported conformance probes for the whole session: ``quantweave_probes.get("conv2d",
    "static")`` returns a copy (model, inputs, exported graph module); each (pattern, mode)
    is exported once."""
    from .probes import ProbeCache

    return ProbeCache()

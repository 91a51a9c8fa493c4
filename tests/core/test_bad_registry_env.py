"""Bad input to the registry and the QUANTWEAVE_* environment variables (issue #20): a value
that is not understood raises naming the variable and the value and listing the accepted
ones; a name that is not a str, or a factory that returns a class, raises saying so. Each
test uses a fresh, isolated PluginManager (never the installed plugins' state)."""

from __future__ import annotations

import warnings

import pytest

import quantweave as qw
from quantweave.plugin_api import QuantizerInfo, hookimpl
from quantweave.registry import ENV_DISABLE, ENV_LOAD, ENV_STRICT, PluginManager
from tests.helpers import assert_names


class Q(qw.Quantizer):
    def annotate(self, model):
        return model


class Plugin:
    """A plugin object offering quantizer ``alpha`` built by ``factory``."""

    QUANTWEAVE_PLUGIN_API = 2

    def __init__(self, factory=Q) -> None:
        self.factory = factory

    @hookimpl
    def quantweave_quantizers(self):
        return [QuantizerInfo(name="alpha", factory=self.factory)]


def manager(plugin: object | None = None, **environ: str) -> PluginManager:
    pm = PluginManager(entry_points=[], environ=environ)
    if plugin is not None:
        pm.register("acme", plugin)
    return pm


@pytest.mark.parametrize("value", ["ture", "2", "enabled", "y es", "-1"])
def test_strict_plugins_value_not_understood_raises_naming_variable_value_and_accepted(value):
    pm = PluginManager(entry_points=[], environ={ENV_STRICT: value})
    with pytest.raises(ValueError) as info:
        pm.plugins()
    assert_names(info, ENV_STRICT, repr(value))
    for accepted in ("1", "true", "yes", "on", "0", "false", "no", "off", "empty"):
        assert accepted in str(info.value)
    with pytest.raises(ValueError) as info:  # every query, not only the first: nothing half-loaded
        pm.quantizer_infos()
    assert_names(info, ENV_STRICT)


@pytest.mark.parametrize(
    ("value", "strict"),
    [
        *[("1", True), ("true", True), (" YES ", True), ("On", True)],
        *[("0", False), ("false", False), ("no", False), ("OFF", False), ("", False)],
    ],
)
def test_strict_plugins_accepts_the_documented_values(value, strict):
    pm = PluginManager(entry_points=[], environ={ENV_STRICT: value})
    assert pm.strict is strict
    assert pm.plugins() == []


def test_the_cli_reports_a_value_not_understood_and_exits_2(capsys):
    from quantweave.cli import main

    pm = PluginManager(entry_points=[], environ={ENV_STRICT: "maybe"})
    assert main(["plugins"], manager=pm) == 2
    assert f"quantweave: {ENV_STRICT}='maybe' is not understood" in capsys.readouterr().err


def test_strict_plugins_unset_is_not_strict():
    assert PluginManager(entry_points=[], environ={}).strict is False


@pytest.mark.parametrize("variable", [ENV_DISABLE, ENV_LOAD])
@pytest.mark.parametrize("value", ["acme;other", "acme other"])
def test_plugin_lists_not_separated_by_commas_warn_naming_the_variable_and_the_separator(variable, value):
    pm = PluginManager(entry_points=[], environ={variable: value})
    with pytest.warns(qw.PluginWarning) as caught:
        pm.plugins()
    assert_names(caught, variable, repr(value), "commas")


@pytest.mark.parametrize("name", [None, 3, ("alpha",)], ids=["None", "int", "tuple"])
def test_a_quantizer_name_that_is_not_a_str_raises_naming_what_was_given(name):
    pm = manager(Plugin())
    with pytest.raises(TypeError) as info:
        pm.get_quantizer(name)
    assert_names(info, "quantizer name", "str", type(name).__name__, "acme")


def test_a_quantizer_instead_of_its_name_says_get_quantizer_builds_from_a_name():
    pm = manager(Plugin())
    with pytest.raises(TypeError) as info:
        pm.get_quantizer(Q())
    assert_names(info, "got Q", "from its name")


def test_get_quantizer_with_none_through_the_top_level_api_raises_type_error():
    with pytest.raises(TypeError) as info:
        qw.get_quantizer(None)
    assert_names(info, "quantizer name", "str", "NoneType")


def test_a_factory_that_returns_a_class_raises_naming_the_plugin_and_the_class():
    pm = manager(Plugin(factory=lambda **options: Q))
    with pytest.raises(qw.PluginError) as info:
        pm.get_quantizer("alpha")
    assert_names(info, "acme:alpha", "class Q", "instance", "'acme'")


def test_a_good_registry_neither_warns_nor_raises():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pm = manager(Plugin(), **{ENV_STRICT: "1"})
        quantizer = pm.get_quantizer("acme:alpha")
    assert isinstance(quantizer, Q) and quantizer.plugin == "acme"

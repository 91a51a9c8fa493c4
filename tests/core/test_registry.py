"""Plugin discovery and the registry, each test on a fresh, isolated PluginManager."""

import importlib
import importlib.metadata
import sys
import textwrap
import warnings

import pytest

import quantweave as qw
from quantweave.capabilities import Capability, Mode, TensorQuant
from quantweave.plugin_api import hookimpl
from quantweave.registry import PluginManager, QuantizerInfo
from tests.helpers import assert_names

ACT = TensorQuant("uint8", 0, 255)

GOOD = """
import quantweave as qw
from quantweave.capabilities import Capability, TensorQuant
from quantweave.hookspecs import hookimpl
from quantweave.registry import QuantizerInfo

QUANTWEAVE_PLUGIN_API = 1

class Q(qw.Quantizer):
    def __init__(self, flavour="plain"):
        self.flavour = flavour
    def annotate(self, model):
        return model

@hookimpl
def quantweave_quantizers():
    return [QuantizerInfo(name="{qname}", factory=Q,
                          capabilities=(Capability("add", "static", TensorQuant("uint8", 0, 255)),))]
"""


@pytest.fixture
def make_plugin(tmp_path, monkeypatch):
    """Write a module into a temp dir on sys.path; return an entry point for it."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(module, source, name=None):
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        monkeypatch.delitem(sys.modules, module, raising=False)  # a fresh import every test
        importlib.invalidate_caches()
        return importlib.metadata.EntryPoint(name=name or module, value=module, group="quantweave")

    return make


def manager(*eps, **env):
    return PluginManager(entry_points=eps, environ={k: v for k, v in env.items()})


def test_good_plugin_is_listed_and_its_quantizer_built(make_plugin):
    pm = manager(make_plugin("qw_good", GOOD.format(qname="alpha")))
    (record,) = pm.plugins()
    assert (record.name, record.status, record.quantizers, record.error) == ("qw_good", "loaded", ("alpha",), None)
    quantizer = pm.get_quantizer("alpha", flavour="fancy")
    assert isinstance(quantizer, qw.Quantizer) and quantizer.flavour == "fancy"
    assert pm.get_quantizer("qw_good:alpha").flavour == "plain"
    (cap,) = pm.quantization_capabilities()
    assert (cap.pattern, cap.mode, cap.plugin, cap.quantizer) == ("add", Mode.STATIC, "qw_good", "alpha")


def test_loading_is_lazy(make_plugin, tmp_path):
    ep = make_plugin("qw_lazy", "raise RuntimeError('imported too early')")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # constructing the manager imports nothing, so nothing fails yet
        pm = manager(ep)
    assert "qw_lazy" not in sys.modules
    with pytest.warns(qw.PluginWarning) as caught:
        pm.plugins()
    assert_names(caught, "'qw_lazy'", "not loaded", "RuntimeError", "imported too early")  # the plugin's own error


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("raise ImportError('missing native lib')", ("import failed", "ImportError", "missing native lib")),
        ("import sys; sys.exit(3)", ("import failed", "SystemExit: 3")),
        ("x = 1", ("does not declare", "QUANTWEAVE_PLUGIN_API")),
        ("QUANTWEAVE_PLUGIN_API = '1'", ("plugin API '1'", "whole number", "1 to 2")),
        ("QUANTWEAVE_PLUGIN_API = 0", ("plugin API 0", "whole number", "1 to 2")),
        (
            "from quantweave.hookspecs import hookimpl\nQUANTWEAVE_PLUGIN_API = 1\n"
            "@hookimpl\ndef quantweave_quantizer():\n    return []\n",
            ("invalid hooks", "'quantweave_quantizer'"),
        ),
        (
            "from quantweave.hookspecs import hookimpl\nQUANTWEAVE_PLUGIN_API = 1\n"
            "@hookimpl\ndef quantweave_quantizers():\n    raise ValueError('bad config')\n",
            ("quantweave_quantizers()", "failed", "ValueError", "bad config"),
        ),
        (
            "from quantweave.hookspecs import hookimpl\nQUANTWEAVE_PLUGIN_API = 1\n"
            "@hookimpl\ndef quantweave_quantizers():\n    return 'x86'\n",
            ("quantweave_quantizers()", "list of QuantizerInfo", "got str"),
        ),
    ],
)
def test_broken_plugins_are_recorded_and_never_crash_the_host(make_plugin, source, reason):
    good = make_plugin("qw_fine", GOOD.format(qname="fine"))
    bad = make_plugin("qw_bad", source)
    pm = manager(bad, good)
    with pytest.warns(qw.PluginWarning) as caught:
        records = {r.name: r for r in pm.plugins()}
    assert_names(caught, "quantweave plugin 'qw_bad'", "not loaded", *reason)
    assert records["qw_bad"].status == "failed"
    assert records["qw_fine"].status == "loaded"
    assert pm.get_quantizer("fine") is not None
    with pytest.raises(qw.UnknownQuantizerError):
        pm.get_quantizer("qw_bad")


def test_strict_mode_reraises(make_plugin):
    pm = manager(make_plugin("qw_boom", "raise ImportError('nope')"), QUANTWEAVE_STRICT_PLUGINS="1")
    with pytest.raises(qw.PluginError) as info:
        pm.plugins()
    assert_names(info, "'qw_boom'", "not loaded", "ImportError", "nope")


def test_strict_failure_leaves_the_registry_complete(make_plugin):
    # regression: the raise used to stop loading, so later queries saw only the failed plugin
    bad = make_plugin("qw_boom", "raise ImportError('nope')")
    good = make_plugin("qw_fine", GOOD.format(qname="fine"))
    pm = manager(bad, good, QUANTWEAVE_STRICT_PLUGINS="1")
    with pytest.raises(qw.PluginError) as info:
        pm.get_quantizer("fine")
    assert_names(info, "qw_boom")
    assert {r.name: r.status for r in pm.plugins()} == {"qw_boom": "failed", "qw_fine": "loaded"}
    assert pm.get_quantizer("fine").flavour == "plain"


def test_disable_and_allow_list_env_vars(make_plugin):
    a = make_plugin("qw_a", GOOD.format(qname="a"))
    b = make_plugin("qw_b", GOOD.format(qname="b"))
    disabled = {r.name: r for r in manager(a, b, QUANTWEAVE_DISABLE_PLUGINS="qw_a").plugins()}
    assert disabled["qw_a"].status == "disabled" and "QUANTWEAVE_DISABLE_PLUGINS" in disabled["qw_a"].error
    assert disabled["qw_b"].status == "loaded"
    only_b = {r.name: r.status for r in manager(a, b, QUANTWEAVE_LOAD_PLUGINS="qw_b").plugins()}
    assert only_b == {"qw_a": "disabled", "qw_b": "loaded"}
    none = {r.name: r.status for r in manager(a, b, QUANTWEAVE_LOAD_PLUGINS="").plugins()}
    assert none == {"qw_a": "disabled", "qw_b": "disabled"}


def test_duplicate_entry_points_are_deduplicated(make_plugin):
    ep = make_plugin("qw_dup", GOOD.format(qname="dup"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        records = manager(ep, ep).plugins()
    assert [r.name for r in records] == ["qw_dup"]


def test_same_plugin_name_from_two_modules_keeps_the_first(make_plugin):
    first = make_plugin("qw_one", GOOD.format(qname="one"), name="clash")
    second = make_plugin("qw_two", GOOD.format(qname="two"), name="clash")
    pm = manager(first, second)
    with pytest.warns(qw.PluginWarning) as caught:
        (record,) = pm.plugins()
    assert_names(caught, "duplicate", "'clash'")
    assert record.quantizers == ("one",)


def test_unknown_and_ambiguous_names_list_what_is_available(make_plugin):
    pm = manager(make_plugin("qw_p1", GOOD.format(qname="same")), make_plugin("qw_p2", GOOD.format(qname="same")))
    with pytest.raises(qw.UnknownQuantizerError) as info:
        pm.get_quantizer("x86")
    assert_names(info, "'x86'", "available", "qw_p1:same", "qw_p2:same")
    with pytest.raises(qw.UnknownQuantizerError) as info:
        pm.get_quantizer("same")
    assert_names(info, "'same'", "ambiguous", "qw_p1:same", "qw_p2:same")
    assert pm.get_quantizer("qw_p2:same") is not None


def test_bad_factory_options_name_the_quantizer(make_plugin):
    pm = manager(make_plugin("qw_opts", GOOD.format(qname="opts")))
    with pytest.raises(TypeError) as info:
        pm.get_quantizer("opts", colour="red")
    assert_names(info, "qw_opts:opts", "'colour'")


def test_register_objects_directly_and_filter_capabilities():
    class Plugin:
        QUANTWEAVE_PLUGIN_API = 1

        @hookimpl
        def quantweave_quantizers(self):
            class Q(qw.Quantizer):
                def annotate(self, model):
                    return model

            caps = (
                Capability("linear", "static", ACT, TensorQuant("int8", -128, 127, "per_channel", True)),
                Capability("linear", "dynamic", ACT, TensorQuant("int8", -128, 127, "per_channel", True)),
            )
            return [QuantizerInfo("inproc", Q, caps, mode_options={"dynamic": {}})]

    pm = PluginManager(entry_points=[])
    assert pm.register("inproc", Plugin()).status == "loaded"
    assert [c.mode for c in pm.quantization_capabilities(mode="dynamic")] == [Mode.DYNAMIC]
    assert pm.quantization_capabilities(plugin="other") == []


def test_quantizer_info_validates_its_declaration():
    class Q(qw.Quantizer):
        def annotate(self, model):
            return model

    with pytest.raises(ValueError) as info:
        QuantizerInfo("X86 Quantizer", Q)
    assert_names(info, "name", "lower-case")
    with pytest.raises(ValueError) as info:
        QuantizerInfo("q", Q, (Capability("linear", "dynamic", ACT),))
    assert_names(info, "linear", "dynamic", "mode_options")
    with pytest.raises(ValueError) as info:
        QuantizerInfo("q", Q, ("linear",))
    assert_names(info, "capabilities", "Capability", "str")


def test_top_level_functions_query_the_default_manager(make_plugin, monkeypatch):
    import quantweave.registry as registry

    monkeypatch.setattr(registry, "_DEFAULT", manager(make_plugin("qw_top", GOOD.format(qname="top"))))
    assert [(r.name, r.status) for r in qw.plugins()] == [("qw_top", "loaded")]
    assert qw.get_quantizer("top").plugin == "qw_top"
    assert [(c.pattern, c.plugin) for c in qw.quantization_capabilities()] == [("add", "qw_top")]


def test_unknown_names_in_the_env_vars_are_warned_about(make_plugin):
    a = make_plugin("qw_a", GOOD.format(qname="a"))
    with pytest.warns(qw.PluginWarning) as caught:
        records = {r.name: r.status for r in manager(a, QUANTWEAVE_DISABLE_PLUGINS="qw_a,typo").plugins()}
    assert records == {"qw_a": "disabled"}
    (message,) = [str(w.message) for w in caught]
    assert message == (
        "QUANTWEAVE_DISABLE_PLUGINS names 'typo', which is not an installed quantweave plugin "
        "(installed plugins: qw_a); it has no effect"
    )
    with pytest.warns(qw.PluginWarning) as caught:
        manager(a, QUANTWEAVE_LOAD_PLUGINS="a").plugins()  # the quantizer's name, not the plugin's
    assert_names(caught, "QUANTWEAVE_LOAD_PLUGINS", "'a'", "qw_a")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # known names, or empty lists: nothing to say
        manager(a, QUANTWEAVE_LOAD_PLUGINS="qw_a", QUANTWEAVE_DISABLE_PLUGINS="").plugins()


def test_a_quantizer_of_a_disabled_plugin_says_it_is_disabled_and_by_which_variable(make_plugin):
    a = make_plugin("qw_a", GOOD.format(qname="qw_a"))
    b = make_plugin("qw_b", GOOD.format(qname="b"))
    pm = manager(a, b, QUANTWEAVE_DISABLE_PLUGINS="qw_a")
    with pytest.raises(qw.UnknownQuantizerError) as caught:
        pm.get_quantizer("qw_a")
    assert str(caught.value) == (
        "no quantizer named 'qw_a' is available: plugin 'qw_a' is disabled by QUANTWEAVE_DISABLE_PLUGINS "
        "(to load it, unset QUANTWEAVE_DISABLE_PLUGINS or remove 'qw_a' from it); available: qw_b:b"
    )
    pm = manager(a, b, QUANTWEAVE_LOAD_PLUGINS="qw_b")
    with pytest.raises(qw.UnknownQuantizerError) as info:
        pm.get_quantizer("qw_a:qw_a")
    assert_names(info, "'qw_a'", "QUANTWEAVE_LOAD_PLUGINS")
    broken = make_plugin("qw_broken", "raise ImportError('no native lib')")
    with pytest.warns(qw.PluginWarning):
        pm = manager(broken)
        with pytest.raises(qw.UnknownQuantizerError) as info:
            pm.get_quantizer("qw_broken")
        assert_names(info, "'qw_broken'", "not loaded", "failed")

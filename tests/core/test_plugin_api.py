"""The plugin contract: a leaf module, a compatibility policy, plugins that extend the vocabulary."""

import json
import subprocess
import sys

import pytest
import torch

import quantweave as qw
from quantweave import plugin_api
from quantweave.hookspecs import QuantweaveHookSpecs, hookspec
from quantweave.plugin_api import Capability, Mode, PatternSpec, QuantizerInfo, TensorQuant, hookimpl
from quantweave.registry import PluginManager
from tests.helpers import assert_names

ACT = TensorQuant("int8", -128, 127, "per_tensor", symmetric=True)


class Nothing(qw.Quantizer):
    def annotate(self, model):
        return model


class Api1Plugin:
    """Written against plugin API 1: one hook, no arguments."""

    QUANTWEAVE_PLUGIN_API = 1

    @hookimpl
    def quantweave_quantizers(self):
        return [QuantizerInfo("old", Nothing, (Capability("add", "static", ACT),))]


@pytest.fixture(scope="module")
def imported_modules() -> dict[str, list[str]]:
    """One fresh interpreter: the modules loaded after ``import quantweave.plugin_api`` alone, then
    after ``import quantweave`` (importing the contract first hides nothing the second would load)."""
    code = (
        "import json, sys\n"
        "import quantweave.plugin_api\n"
        "after_api = sorted(sys.modules)\n"
        "import quantweave\n"
        "print(json.dumps({'plugin_api': after_api, 'quantweave': sorted(sys.modules)}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_plugin_api_imports_neither_the_loader_nor_pluggy(imported_modules):
    bad = [m for m in imported_modules["plugin_api"] if m == "quantweave.registry" or m.startswith("pluggy")]
    assert bad == []


def test_import_quantweave_imports_no_plugin(imported_modules):
    bad = [m for m in imported_modules["quantweave"] if m.startswith("quantweave_") or m == "quantweave.registry"]
    assert bad == []


def test_hookimpl_marks_what_pluggy_reads():
    import pluggy

    pm = pluggy.PluginManager("quantweave")
    pm.add_hookspecs(QuantweaveHookSpecs)
    pm.register(Api1Plugin())
    (result,) = pm.hook.quantweave_quantizers()
    assert [info.name for info in result] == ["old"]


class FutureSpecs(QuantweaveHookSpecs):
    """A simulated plugin API 3: a new argument on an old hook, and a new hook."""

    @hookspec
    def quantweave_quantizers(self, core_features):  # type: ignore[override]
        """API 3 passes the core's feature set."""

    @hookspec
    def quantweave_observers(self):
        """API 3: observer classes a plugin provides."""


class FutureCore(PluginManager):
    api_version = 3
    hookspecs = FutureSpecs

    def hook_arguments(self, hook):
        return {"core_features": frozenset({"groupwise"})} if hook == "quantweave_quantizers" else {}


def test_a_newer_core_with_more_hooks_and_arguments_loads_an_api1_plugin():
    pm = FutureCore(entry_points=[])
    record = pm.register("legacy", Api1Plugin())
    assert (record.status, record.api, record.quantizers) == ("loaded", 1, ("old",))
    assert [(c.pattern, c.plugin) for c in pm.quantization_capabilities()] == [("add", "legacy")]


def test_a_newer_core_passes_its_new_argument_to_plugins_that_ask_for_it():
    seen = []

    class Api3Plugin:
        QUANTWEAVE_PLUGIN_API = 3

        @hookimpl
        def quantweave_quantizers(self, core_features):
            seen.append(core_features)
            return []

    assert FutureCore(entry_points=[]).register("new", Api3Plugin()).status == "loaded"
    assert seen == [frozenset({"groupwise"})]


def test_a_plugin_for_a_newer_api_is_reported_incompatible_with_both_numbers():
    class OldCore(PluginManager):
        api_version = 1

    class Api2Plugin(Api1Plugin):
        QUANTWEAVE_PLUGIN_API = 2

    pm = OldCore(entry_points=[])
    with pytest.warns(qw.PluginWarning) as caught:
        record = pm.register("modern", Api2Plugin(), distribution="qw-modern", version="1.0")
    assert (record.status, record.api) == ("incompatible", 2)
    # the plugin, its distribution, the API it declares, this core's version and APIs, the release that loads it
    assert_names(caught, "'modern'", "qw-modern 1.0", "plugin API 2", qw.__version__, "1..1", "quantweave>=0.1.1")
    assert_names(record.error, "plugin API 2", qw.__version__, "1..1", "quantweave>=0.1.1")
    with pytest.raises(qw.UnknownQuantizerError):
        pm.get_quantizer("old")


def test_an_unknown_future_api_says_what_would_load_it():
    class Api9Plugin(Api1Plugin):
        QUANTWEAVE_PLUGIN_API = 9

    with pytest.warns(qw.PluginWarning):
        record = PluginManager(entry_points=[]).register("far", Api9Plugin())
    assert record.status == "incompatible"
    assert record.error.endswith("it needs a newer quantweave, one implementing plugin API 9")


def test_every_plugin_api_version_names_its_release():
    assert sorted(plugin_api.PLUGIN_API_RELEASES) == list(range(1, plugin_api.PLUGIN_API_VERSION + 1))


# -- plugins extend the vocabulary ---------------------------------------------------------------


def conv3d_probe():
    return torch.nn.Sequential(torch.nn.Conv3d(2, 4, 3)), (torch.randn(1, 2, 6, 6, 6),)


CONV3D = PatternSpec("conv3d", "3-D convolution", ("aten.conv3d.default",), conv3d_probe)


class VendorPlugin:
    QUANTWEAVE_PLUGIN_API = 2

    def __init__(self, patterns=(CONV3D,), declared=("conv3d",)):
        self.patterns, self.declared = list(patterns), declared

    @hookimpl
    def quantweave_patterns(self):
        return self.patterns

    @hookimpl
    def quantweave_quantizers(self):
        caps = tuple(Capability(p, Mode.STATIC, ACT) for p in self.declared)
        return [QuantizerInfo("npu", Nothing, caps)]


def test_a_contributed_pattern_joins_the_vocabulary_with_its_origin():
    pm = PluginManager(entry_points=[])
    assert pm.register("vendor", VendorPlugin()).status == "loaded"
    spec = pm.patterns()["conv3d"]
    assert (spec.origin, spec.ops, spec.probe) == ("vendor", ("aten.conv3d.default",), conv3d_probe)
    assert pm.patterns()["conv2d"].origin == "core"
    (cap,) = pm.quantization_capabilities()
    assert (cap.pattern, cap.ops, cap.plugin) == ("conv3d", ("aten.conv3d.default",), "vendor")


def test_a_clash_with_a_core_pattern_is_reported_and_ignored():
    clash = PatternSpec("conv2d", "my conv", ("aten.conv2d.default",))
    pm = PluginManager(entry_points=[])
    with pytest.warns(qw.PluginWarning) as caught:
        record = pm.register("vendor", VendorPlugin(patterns=[clash], declared=("conv2d",)))
    assert_names(caught, "'vendor'", "'conv2d'", "core pattern")
    assert record.status == "loaded"
    assert pm.patterns()["conv2d"].origin == "core"
    assert "is a core pattern" in pm.plugins()[0].warnings[0]


def test_a_clash_between_two_plugins_names_both_and_keeps_the_first_by_name():
    pm = PluginManager(entry_points=[])
    pm.register("alpha", VendorPlugin())
    with pytest.warns(qw.PluginWarning) as caught:
        pm.register("beta", VendorPlugin())
    assert_names(caught, "'beta'", "'conv3d'", "'alpha'")
    assert pm.patterns()["conv3d"].origin == "alpha"


def test_a_capability_for_an_unknown_pattern_fails_the_plugin_naming_the_pattern():
    pm = PluginManager(entry_points=[])
    with pytest.warns(qw.PluginWarning) as caught:
        record = pm.register("vendor", VendorPlugin(patterns=[]))
    assert_names(caught, "capabilities", "conv3d")
    assert record.status == "failed"
    assert pm.quantizer_infos() == {}


def test_malformed_pattern_specs_are_rejected_with_what_was_expected():
    with pytest.raises(ValueError) as info:
        PatternSpec("conv3d", "3-D convolution", ("conv3d",))
    assert_names(info, "ops", "non-empty", "'aten.conv3d.default'")
    with pytest.raises(ValueError) as info:
        PatternSpec("Conv3D", "3-D convolution", ("aten.conv3d.default",))
    assert_names(info, "name", "lower-case")
    pm = PluginManager(entry_points=[])
    with pytest.warns(qw.PluginWarning) as caught:
        assert pm.register("vendor", VendorPlugin(patterns=["conv3d"])).status == "failed"
    assert_names(caught, "quantweave_patterns()", "PatternSpec")

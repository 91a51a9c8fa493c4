"""The quantweave CLI: plugins and capabilities, as text and JSON."""

import json

import pytest

import quantweave as qw
from quantweave.capabilities import Capability, TensorQuant
from quantweave.cli import main
from quantweave.plugin_api import hookimpl
from quantweave.registry import PluginManager, QuantizerInfo
from tests.helpers import run_cli as run

ACT = TensorQuant("uint8", 0, 255)
W = TensorQuant("int8", -128, 127, "per_channel", symmetric=True)


class Q(qw.Quantizer):
    def annotate(self, model):
        return model


class Plugin:
    QUANTWEAVE_PLUGIN_API = 1

    def __init__(self, name, caps):
        self.name, self.caps = name, caps

    @hookimpl
    def quantweave_quantizers(self):
        return [QuantizerInfo(self.name, Q, self.caps, mode_options={"dynamic": {}})]


class Broken:
    QUANTWEAVE_PLUGIN_API = 7


@pytest.fixture
def pm():
    manager = PluginManager(entry_points=[])
    manager.register(
        "alpha",
        Plugin("a", (Capability("conv2d", "static", ACT, W), Capability("linear", "dynamic", ACT, W))),
        distribution="qw-alpha",
        version="1.2.0",
    )
    manager.register("beta", Plugin("beta", (Capability("linear", "static", ACT, W),)))
    with pytest.warns(qw.PluginWarning):
        manager.register("gamma", Broken(), distribution="qw-gamma", version="0.1")
    return manager


def test_plugins_table(capsys, pm):
    code, out = run(capsys, pm, "plugins")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["plugin", "status", "api", "distribution", "version", "quantizers", "error"]
    assert lines[2].split() == ["alpha", "loaded", "1", "qw-alpha", "1.2.0", "a"]
    assert lines[3].split() == ["beta", "loaded", "1", "-", "-", "beta"]
    assert lines[4].split()[:6] == ["gamma", "incompatible", "7", "qw-gamma", "0.1", "-"]
    assert f"declares plugin API 7, but this quantweave {qw.__version__} implements plugin API 1..2" in lines[4]


def test_plugins_json(capsys, pm):
    _, out = run(capsys, pm, "plugins", "--json")
    data = json.loads(out)
    assert [d["name"] for d in data] == ["alpha", "beta", "gamma"]
    assert data[0] == {
        "name": "alpha",
        "distribution": "qw-alpha",
        "version": "1.2.0",
        "status": "loaded",
        "api": 1,
        "quantizers": ["a"],
        "error": None,
        "warnings": [],
    }
    assert data[2]["status"] == "incompatible" and "plugin API 7" in data[2]["error"]


def test_capabilities_table_is_pattern_by_quantizer(capsys, pm):
    code, out = run(capsys, pm, "capabilities")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["pattern", "origin", "a", "beta"]
    table, legend = lines[: lines.index("")], lines[lines.index("") + 1 :]
    rows = {line.split()[0]: line.split()[1:] for line in table[2:]}
    assert rows == {"conv2d": ["core", "static", "-"], "linear": ["core", "dynamic", "static"]}
    assert legend == [
        "columns (quantizer, as get_quantizer names it):",
        "  a     quantizer 'a' of plugin 'alpha' (qw-alpha 1.2.0)",
        "  beta  quantizer 'beta' of plugin 'beta'",
        "cells: the modes the quantizer declares for the pattern (static, dynamic, qat, weight_only); '-': none",
        "origin: 'core' (the vocabulary) or the plugin that contributed the pattern; one row per capability: --details",
    ]


def test_capability_columns_are_qualified_only_when_two_plugins_share_a_quantizer_name(capsys):
    pm = PluginManager(entry_points=[])
    pm.register("one", Plugin("same", (Capability("conv2d", "static", ACT, W),)))
    pm.register("two", Plugin("same", (Capability("linear", "static", ACT, W),)))
    _, out = run(capsys, pm, "capabilities")
    assert out.splitlines()[0].split() == ["pattern", "origin", "one:same", "two:same"]
    assert "  one:same  quantizer 'same' of plugin 'one'" in out.splitlines()


def test_capabilities_filters_and_json(capsys, pm):
    _, out = run(capsys, pm, "capabilities", "--mode", "dynamic", "--json")
    (record,) = json.loads(out)
    assert (record["pattern"], record["mode"], record["pattern_origin"]) == ("linear", "dynamic", "core")
    assert (record["plugin"], record["quantizer"]) == ("alpha", "a")
    assert record["activation"] == {
        "dtype": "uint8",
        "quant_min": 0,
        "quant_max": 255,
        "granularity": "per_tensor",
        "symmetric": False,
        "ch_axis": None,
    }
    assert Capability.from_dict(record) == pm.quantization_capabilities(mode="dynamic")[0]
    _, out = run(capsys, pm, "capabilities", "--plugin", "beta")
    assert out.splitlines()[0].split() == ["pattern", "origin", "beta"]


def test_unknown_plugin_filter_is_an_error(capsys, pm):
    code = main(["capabilities", "--plugin", "nope"], manager=pm)
    err = capsys.readouterr().err
    assert code == 2 and "no plugin named 'nope'; installed: alpha, beta, gamma" in err


def test_version_names_the_core_torch_and_every_plugin(capsys, pm):
    import torch

    code, out = run(capsys, pm, "--version")
    assert code == 0
    assert out.splitlines() == [
        f"quantweave {qw.__version__} (plugin API 2, torch {torch.__version__})",
        "  plugin alpha: qw-alpha 1.2.0, loaded",
        "  plugin beta: (not from a distribution), loaded",
        "  plugin gamma: qw-gamma 0.1, incompatible",
    ]


def test_help_describes_each_command_and_the_env_vars(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    for line in ("plugins     list installed plugins and their status", "--version", "QUANTWEAVE_DISABLE_PLUGINS"):
        assert line in out
    for command, words in (("plugins", "its status (loaded, failed"), ("capabilities", "in which modes")):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert words in " ".join(capsys.readouterr().out.split())


def test_no_command_is_an_error_listing_the_commands(capsys):
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert "a command is required: plugins, capabilities" in capsys.readouterr().err

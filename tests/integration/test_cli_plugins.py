"""The command line with the installed plugins (x86): moved from tests/core/test_cli.py so that
tests/core runs without plugins."""

import importlib.metadata
import json
import subprocess
import sys

import quantweave as qw
from quantweave.registry import PluginManager
from tests.helpers import run_cli


def test_python_dash_m_runs_the_cli():
    proc = subprocess.run(
        [sys.executable, "-m", "quantweave", "plugins", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env={"QUANTWEAVE_LOAD_PLUGINS": "", "PATH": ""},
    )
    installed = sorted({ep.name for ep in importlib.metadata.entry_points(group="quantweave")})
    assert installed, "the test environments install quantweave-x86, so at least one plugin is seen"
    assert [(d["name"], d["status"]) for d in json.loads(proc.stdout)] == [(name, "disabled") for name in installed]


def test_capability_details_show_what_happens_to_the_whole_pattern(capsys):
    from quantweave_x86 import plugin as x86_plugin

    pm = PluginManager(entry_points=[])
    pm.register("x86", x86_plugin)
    code, out = run_cli(capsys, pm, "capabilities", "--plugin", "x86", "--mode", "static", "--details")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == [
        "pattern",
        "mode",
        "quantizer",
        "activation",
        "weight",
        "bias",
        "output",
        "fused",
        "when",
    ]
    rows = {line.split("  ")[0].strip(): line for line in lines[2:-1]}
    assert "shared with input 0" in rows["max_pool2d"] and "after its own patterns" in rows["max_pool2d"]
    conv = rows["conv2d_relu"]
    assert "int8[-128,127] per_channel axis 0 sym" in conv and "float" in conv and " yes " in conv
    assert lines[-1].startswith("quantizer: plugin:quantizer; activation/weight/bias: dtype[qmin,qmax]")


def test_version_of_the_installed_distributions():
    proc = subprocess.run([sys.executable, "-m", "quantweave", "--version"], capture_output=True, text=True, check=True)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"quantweave {qw.__version__} (plugin API 2, torch ")
    x86 = importlib.metadata.version("quantweave-x86")
    assert f"  plugin x86: quantweave-x86 {x86}, loaded" in lines

"""End to end over really installed distributions (tox env `plugins`).

Installed there: quantweave, quantweave-x86 and quantweave-contrib-template (good),
qw-fixture-broken (raises at import), qw-fixture-incompatible (plugin API 99). Everything goes through the installed
entry points and the `quantweave` console script, as a user would see it.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess

import pytest

FIXTURES = ("quantweave-x86", "quantweave-contrib-template", "qw-fixture-broken", "qw-fixture-incompatible")

pytestmark = pytest.mark.installed


def _installed(dist):
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


if not all(_installed(d) for d in FIXTURES):
    pytest.skip("needs the fixture plugin distributions installed (tox -e plugins)", allow_module_level=True)


def cli(*args, **env):
    exe = shutil.which("quantweave")
    assert exe, "the quantweave console script is installed"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("QUANTWEAVE_")}
    environ.update(env)
    proc = subprocess.run([exe, *args], capture_output=True, text=True, env=environ, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def records(**env):
    proc = cli("plugins", "--json", **env)
    return {r["name"]: r for r in json.loads(proc.stdout)}, proc.stderr


def test_cli_lists_good_broken_and_incompatible_plugins():
    plugins, stderr = records()
    assert plugins["template"]["status"] == "loaded"
    assert plugins["template"]["distribution"] == "quantweave-contrib-template"
    assert plugins["template"]["version"] == "0.1.0"
    assert plugins["template"]["quantizers"] == ["template"]
    assert (plugins["x86"]["status"], plugins["x86"]["distribution"]) == ("loaded", "quantweave-x86")
    assert plugins["broken"]["status"] == "failed"
    assert "import failed: ImportError: libbackend.so" in plugins["broken"]["error"]
    assert plugins["incompatible"]["status"] == "failed"
    assert "declares plugin API 99" in plugins["incompatible"]["error"]
    assert "PluginWarning" in stderr and "'broken'" in stderr


def test_cli_text_table_and_capabilities():
    text = cli("plugins").stdout
    assert "template" in text and "failed" in text
    caps = cli("capabilities", "--plugin", "template").stdout.splitlines()
    assert caps[0].split() == ["pattern", "template:template"]
    everything = cli("capabilities").stdout.splitlines()
    assert everything[0].split() == ["pattern", "template:template", "x86:x86"]
    rows = {line.split()[0]: line.split()[1] for line in caps[2:]}
    assert rows == {"conv2d": "static", "conv2d_relu": "static", "linear": "static,dynamic", "linear_relu": "static"}


def test_disable_allow_list_and_strict_env_vars():
    plugins, stderr = records(QUANTWEAVE_DISABLE_PLUGINS="broken,incompatible")
    assert {n: r["status"] for n, r in plugins.items()} == {
        "broken": "disabled",
        "incompatible": "disabled",
        "template": "loaded",
        "x86": "loaded",
    }
    assert "PluginWarning" not in stderr
    plugins, _ = records(QUANTWEAVE_LOAD_PLUGINS="")
    assert {r["status"] for r in plugins.values()} == {"disabled"}
    exe = shutil.which("quantweave")
    strict = subprocess.run(
        [exe, "plugins"], capture_output=True, text=True, env={**os.environ, "QUANTWEAVE_STRICT_PLUGINS": "1"}
    )
    assert strict.returncode != 0 and "PluginError" in strict.stderr


def test_registry_api_in_process():
    import quantweave as qw

    manager = qw.PluginManager()  # fresh, over the installed entry points
    with pytest.warns(qw.PluginWarning):
        names = {r.name: r.status for r in manager.plugins()}
    assert names == {"broken": "failed", "incompatible": "failed", "template": "loaded", "x86": "loaded"}
    quantizer = manager.get_quantizer("template", is_dynamic=True)
    assert [c.mode.value for c in quantizer.quantization_capabilities()] == ["dynamic"]
    with pytest.raises(
        qw.UnknownQuantizerError, match=r"no quantizer named 'xnnpack'; available: template:template, x86:x86"
    ):
        manager.get_quantizer("xnnpack")
    assert manager.get_quantizer("x86").name == "x86"

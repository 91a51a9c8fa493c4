"""End to end over really installed distributions (tox env `plugins`).

Installed there: quantweave, quantweave-x86 and quantweave-contrib-template (good),
qw-fixture-api1 (good, written against plugin API 1 and kept unchanged),
qw-fixture-broken (raises at import), qw-fixture-incompatible (plugin API 99). Everything goes through the installed
entry points and the `quantweave` console script, as a user would see it.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess

import pytest

from tests.helpers import assert_names

FIXTURES = (
    "quantweave-x86",
    "quantweave-contrib-template",
    "qw-fixture-api1",
    "qw-fixture-broken",
    "qw-fixture-incompatible",
)

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
    assert plugins["template"]["version"] == importlib.metadata.version("quantweave-contrib-template")
    assert plugins["template"]["quantizers"] == ["template"]
    assert (plugins["x86"]["status"], plugins["x86"]["distribution"]) == ("loaded", "quantweave-x86")
    assert plugins["broken"]["status"] == "failed"
    assert "import failed: ImportError: libbackend.so" in plugins["broken"]["error"]
    assert (plugins["incompatible"]["status"], plugins["incompatible"]["api"]) == ("incompatible", 99)
    assert "declares plugin API 99, but this quantweave" in plugins["incompatible"]["error"]
    assert (plugins["api1"]["status"], plugins["api1"]["api"], plugins["api1"]["quantizers"]) == ("loaded", 1, ["api1"])
    assert "PluginWarning" in stderr and "'broken'" in stderr


def test_cli_text_table_and_capabilities():
    text = cli("plugins").stdout
    assert "template" in text and "failed" in text
    caps = cli("capabilities", "--plugin", "template").stdout.splitlines()
    assert caps[0].split() == ["pattern", "origin", "template"]
    assert "  template  quantizer 'template' of plugin 'template' (quantweave-contrib-template " in "\n".join(caps)
    caps = caps[: caps.index("")]
    everything = cli("capabilities").stdout.splitlines()
    assert everything[0].split() == ["pattern", "origin", "api1", "template", "x86"]
    rows = {line.split()[0]: line.split()[2] for line in caps[2:]}
    assert rows == {"conv2d": "static", "conv2d_relu": "static", "linear": "static,dynamic", "linear_relu": "static"}


def test_disable_allow_list_and_strict_env_vars():
    plugins, stderr = records(QUANTWEAVE_DISABLE_PLUGINS="broken,incompatible")
    assert {n: r["status"] for n, r in plugins.items()} == {
        "api1": "loaded",
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
    from quantweave.testing import PluginManager

    manager = PluginManager()  # fresh, over the installed entry points
    with pytest.warns(qw.PluginWarning):
        names = {r.name: r.status for r in manager.plugins()}
    assert names == {
        "api1": "loaded",
        "broken": "failed",
        "incompatible": "incompatible",
        "template": "loaded",
        "x86": "loaded",
    }
    quantizer = manager.get_quantizer("template", is_dynamic=True)
    assert [c.mode.value for c in quantizer.quantization_capabilities()] == ["dynamic"]
    with pytest.raises(qw.UnknownQuantizerError) as info:
        manager.get_quantizer("nope")
    assert_names(info, "'nope'", "api1:api1", "template:template", "x86:x86")
    assert manager.get_quantizer("x86").name == "x86"


def test_an_api1_plugin_composes_with_a_current_one():
    import quantweave as qw
    from quantweave.testing import PluginManager

    manager = PluginManager()
    with pytest.warns(qw.PluginWarning):
        composed = qw.ComposableQuantizer([manager.get_quantizer("api1"), manager.get_quantizer("x86")])
    rows = {(r.pattern, r.mode.value): r for r in composed.capability_table()}
    assert (rows[("linear", "static")].served_by, rows[("linear", "static")].shadowed) == ("api1", ("x86",))
    assert rows[("linear", "static")].capability.plugin == "api1"

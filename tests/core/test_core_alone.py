"""tests/core needs the core only: in the tox env ``core`` (QUANTWEAVE_CORE_ALONE=1: torch, numpy,
pytest and quantweave installed, nothing else) no plugin is importable, none has an entry point and
the registry loads none, so every other test of this directory passed without one."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

import pytest

import quantweave as qw
from tests.helpers import assert_names

#: every plugin distribution of the repository, by the package it installs
PLUGIN_PACKAGES = (
    "quantweave_x86",
    "quantweave_xnnpack",
    "quantweave_embedding",
    "quantweave_executorch",
    "quantweave_vendors",
    "quantweave_onnxruntime",
    "quantweave_contrib_template",
    "quantweave_litert",
    "torchao",
    "executorch",
)

pytestmark = pytest.mark.skipif(
    os.environ.get("QUANTWEAVE_CORE_ALONE") != "1",
    reason="checks the tox env 'core' (QUANTWEAVE_CORE_ALONE=1); here plugins may be installed",
)


@pytest.mark.parametrize("package", PLUGIN_PACKAGES)
def test_no_plugin_package_is_importable(package):
    assert importlib.util.find_spec(package) is None, f"{package} is importable in the core-only env"


def test_no_entry_point_of_the_quantweave_group_is_installed():
    found = [f"{ep.name} = {ep.value}" for ep in importlib.metadata.entry_points(group="quantweave")]
    assert found == [], f"entry points of group 'quantweave' installed: {found}"


def test_the_registry_loads_no_plugin_and_knows_no_quantizer():
    # the users' API over the installed plugins (quantweave.PluginManager is a deprecated alias)
    assert [record.name for record in qw.plugins()] == []
    with pytest.raises(qw.UnknownQuantizerError) as info:
        qw.get_quantizer("x86")
    assert_names(info, "'x86'", "available: none")

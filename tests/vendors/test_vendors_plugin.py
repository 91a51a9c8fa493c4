"""quantweave-vendors without any vendor installed (default env): registration by
``find_spec`` only, the hosting wrapper, and the litert-torch loader on a stand-in package
whose ``__init__`` files raise (so running them would fail the import)."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch
from torch.fx import GraphModule

from quantweave.registry import PluginManager
from quantweave_vendors import _litert
from quantweave_vendors._vendors import Vendor
from quantweave_vendors.hosted import HostedQuantizer
from tests.helpers import assert_names


def test_a_vendor_whose_module_is_absent_is_missing_and_not_registered(monkeypatch):
    import quantweave_vendors.plugin as plugin

    absent = Vendor("absent-q", "AbsentQuantizer", "no_such_vendor_pkg.quantizer", ("torchao",), dict, "none")
    assert absent.missing()[0] == "no_such_vendor_pkg.quantizer"
    monkeypatch.setattr(plugin, "VENDORS", (absent,))
    pm = PluginManager(entry_points=[], strict=False)
    record = pm.register("vendors", plugin)
    assert record.status == "loaded" and record.quantizers == ()


class _FakeVendor:
    def __init__(self) -> None:
        self.config = None
        self.calls: list[str] = []

    def set_global(self, config):
        self.config = config
        return self

    def transform_for_annotation(self, model):
        self.calls.append("transform")
        return model

    def annotate(self, model):
        self.calls.append("annotate")
        return model

    def validate(self, model):
        self.calls.append("validate")


def test_the_wrapper_passes_every_hook_and_the_vendors_own_api_through():
    vendor = _FakeVendor()
    hosted = HostedQuantizer(vendor, "fake")
    # the vendor's API, reached through; a chained call keeps the wrapper (its name and plugin)
    assert hosted.set_global("int8") is hosted and vendor.config == "int8"
    assert hosted.config == "int8"  # attributes are the vendor's
    gm = GraphModule(torch.nn.Module(), torch.fx.Graph())
    assert hosted.transform_for_annotation(gm) is gm and hosted.annotate(gm) is gm
    hosted.validate(gm)
    hosted.prepare_obs_or_fq_callback(gm, {})  # the fake has none: nothing to call
    assert vendor.calls == ["transform", "annotate", "validate"]
    assert hosted.name == "fake" and "fake" in repr(hosted)


def test_the_wrapper_rejects_an_object_without_the_pt2e_hooks():
    with pytest.raises(TypeError) as info:
        HostedQuantizer("not a quantizer", "nope")
    assert_names(info, "HostedQuantizer 'nope'", "str", "no annotate()", "PT2E quantizer")


@pytest.fixture
def stand_in_litert(tmp_path, monkeypatch):
    """A ``litert_torch`` whose package ``__init__`` files raise, and a quantizer module that
    imports its sibling by absolute name (as litert-torch 0.10's does)."""
    root = tmp_path / "litert_torch"
    (root / "quantize").mkdir(parents=True)
    (root / "__init__.py").write_text("raise RuntimeError('litert_torch/__init__ ran')\n")
    (root / "quantize" / "__init__.py").write_text("raise RuntimeError('litert_torch/quantize/__init__ ran')\n")
    (root / "quantize" / "pt2e_quantizer_utils.py").write_text("HELPER = 'utils'\n")
    (root / "quantize" / "pt2e_quantizer.py").write_text(
        textwrap.dedent(
            """
            from litert_torch.quantize.pt2e_quantizer_utils import HELPER

            class PT2EQuantizer:
                helper = HELPER
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    saved = {k: v for k, v in sys.modules.items() if k.startswith("litert_torch")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [k for k in sys.modules if k.startswith("litert_torch")]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_litert_quantizer_module_loads_without_running_the_package_inits(stand_in_litert):
    with pytest.raises(RuntimeError, match="__init__ ran"):
        importlib.import_module("litert_torch.quantize.pt2e_quantizer")  # the ordinary way runs them
    for name in [k for k in sys.modules if k.startswith("litert_torch")]:
        del sys.modules[name]
    module = _litert.load_pt2e_quantizer_module()
    assert module.PT2EQuantizer.helper == "utils"
    assert "litert_torch" not in sys.modules and "litert_torch.quantize" not in sys.modules  # no bare parent left
    assert _litert.load_pt2e_quantizer_module() is module  # loaded once

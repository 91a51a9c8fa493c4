"""Vendors' published PT2E quantizers hosted unmodified by quantweave-vendors (tox env
``hosting``: ExecuTorch 1.5.1, torchao 0.18, tosa-tools, nncf / openvino, litert-torch 0.10,
all with torch 2.13.0).

Per vendor and per model (conv-bn-relu, MLP, attention):

* parity: quantweave's ``prepare_pt2e`` / ``convert_pt2e`` with the vendor's quantizer give
  the converted model torchao's ``prepare_pt2e`` / ``convert_pt2e`` give with the same
  quantizer: the same number of quantize / dequantize nodes, and outputs equal to the last
  bit (max abs diff 0) on the same calibration batches and test input;
* composition: the vendor first, quantweave's own xnnpack quantizer after it, prepares,
  calibrates, converts and runs, keeping every quantize / dequantize the vendor alone gets;
  the other order, for the vendors that rewrite annotations an earlier quantizer made (Arm,
  Samsung), is refused by an ``AnnotationConflictError`` naming the vendor and the node
  (Cortex-M's own check raises first, attributed to it);
* capabilities: the vendor declares none; probing derives them (count > 0, each marked
  ``derived``), in seconds, cached per configuration, merged by ``ComposableQuantizer`` and
  shown by ``quantweave capabilities``.

The plugin itself imports no vendor package when it loads, and imports litert-torch's
quantizer module without running ``litert_torch/__init__``. Where a vendor fails under
torchao too (Cortex-M on an export whose ``.module()`` keeps the ``_guards_fn`` call), the
failure is recorded (strict xfail) and quantweave's error carries the vendor's message plus
the quantizer and hook it came from.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

import quantweave as qw
from quantweave.capabilities import derive_capabilities
from quantweave.cli import main
from quantweave.errors import AnnotationConflictError
from quantweave.plugin_api import hookimpl
from quantweave.registry import PluginManager
from tests.helpers import assert_names

from .parity import MODELS, exported, parity, qdq_count, run_quantweave

pytestmark = pytest.mark.hosting
pytest.importorskip("torchao", reason="needs torchao 0.18 (tox -e hosting)")
pytest.importorskip("executorch", reason="needs ExecuTorch 1.5.1 (tox -e hosting)")

import quantweave_vendors.plugin as vendors_plugin  # noqa: E402
import quantweave_xnnpack.plugin as xnnpack_plugin  # noqa: E402
from quantweave_vendors._vendors import BY_NAME, VENDORS  # noqa: E402

NAMES = [vendor.name for vendor in VENDORS]
#: vendors that rewrite annotations an earlier quantizer made (measured: the other order fails)
REANNOTATE = ("executorch-arm-tosa", "executorch-arm-ethos-u", "executorch-samsung-enn")
#: (vendor, model) -> why quantweave's q/dq count differs from torchao's (values still equal)
#: (vendor, model) -> why quantweave's q/dq count differs from torchao's (none today: Vulkan's dynamic
#: attention was 10 vs 8 until convert kept one dequantize per dynamically quantized tensor)
QDQ_DIFFERS: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def manager() -> PluginManager:
    pm = PluginManager(entry_points=[], strict=False)
    for name, plugin in (("vendors", vendors_plugin), ("xnnpack", xnnpack_plugin)):
        record = pm.register(name, plugin)
        assert record.status == "loaded", record.error
    return pm


_PARITY: dict[tuple[str, str], object] = {}


def _parity(manager: PluginManager, name: str, model: str):
    if (name, model) not in _PARITY:
        _PARITY[(name, model)] = parity(name, BY_NAME[name].build, manager.get_quantizer(name), model)
    return _PARITY[(name, model)]


def test_every_vendor_is_hosted_here(manager):
    """The hosting env installs every vendor: none may silently drop out of the matrix."""
    hosted = {key.split(":", 1)[1] for key in manager.quantizer_infos() if key.startswith("vendors:")}
    assert hosted == set(NAMES), {v.name: v.missing() for v in VENDORS if v.name not in hosted}


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("name", NAMES)
def test_converted_model_equals_torchaos(manager, name, model):
    result = _parity(manager, name, model)
    assert result.max_diff == 0.0, result


@pytest.mark.parametrize(
    ("name", "model"),
    [
        pytest.param(n, m, marks=pytest.mark.xfail(strict=True, reason=QDQ_DIFFERS[(n, m)]))
        if (n, m) in QDQ_DIFFERS
        else (n, m)
        for n in NAMES
        for m in MODELS
    ],
)
def test_quantize_dequantize_count_equals_torchaos(manager, name, model):
    result = _parity(manager, name, model)
    assert result.quantweave_qdq == result.torchao_qdq, result


#: vendors that leave ``_annotated`` unset: a later member cannot see their nodes are taken
UNMARKED = ("executorch-openvino",)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("name", [n for n in NAMES if n not in UNMARKED])
def test_vendor_then_quantweave_xnnpack_composes(manager, name, model):
    composed = qw.ComposableQuantizer([manager.get_quantizer(name), manager.get_quantizer("xnnpack")])
    converted = run_quantweave(composed, model)
    _, _, test = exported(model)
    assert torch.isfinite(converted(*test)).all()
    alone = _parity(manager, name, model)
    assert qdq_count(converted) >= alone.quantweave_qdq > 0 or alone.quantweave_qdq == 0
    assert qdq_count(converted) > 0  # what the vendor leaves (Vulkan: the conv) xnnpack quantizes


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("name", UNMARKED)
def test_a_vendor_leaving_annotated_unset_is_named_with_the_order_that_composes(manager, name, model):
    """OpenVINO leaves ``_annotated`` unset, so quantweave-xnnpack after it re-annotates its
    nodes: the conflict names both, the node, and the order that composes."""
    composed = qw.ComposableQuantizer([manager.get_quantizer(name), manager.get_quantizer("xnnpack")])
    gm, _, _ = exported(model)
    with pytest.raises(AnnotationConflictError) as info:
        qw.prepare_pt2e(gm, composed)
    # the vendor, the field it left unset, the node, the order that composes (the fix)
    assert_names(info, f"quantizer '{name}'", "_annotated unset", "node '", f"'xnnpack' before '{name}'")


@pytest.mark.parametrize("name", REANNOTATE)
def test_a_vendor_rewriting_an_earlier_annotation_is_named(manager, name):
    composed = qw.ComposableQuantizer([manager.get_quantizer("xnnpack"), manager.get_quantizer(name)])
    gm, _, _ = exported("mlp")
    with pytest.raises(AnnotationConflictError) as info:
        qw.prepare_pt2e(gm, composed)
    message = str(info.value)
    assert name in message and "'linear'" in message and "xnnpack" in message


def test_cortex_m_refusing_an_earlier_annotation_is_attributed_to_it(manager):
    """Cortex-M is itself a torchao ComposableQuantizer: its own member check raises first
    (a RuntimeError, as under torchao); quantweave's note names the member it came from."""
    composed = qw.ComposableQuantizer([manager.get_quantizer("xnnpack"), manager.get_quantizer("executorch-cortex-m")])
    gm, _, _ = exported("mlp")
    with pytest.raises(RuntimeError) as info:  # torchao's ComposableQuantizer's message
        qw.prepare_pt2e(gm, composed)
    assert_names(info, "PatternQuantizer", "changed annotations", "node linear")
    assert any("executorch-cortex-m" in note for note in getattr(info.value, "__notes__", []))


@pytest.mark.parametrize("name", NAMES)
def test_capabilities_are_derived_quickly_and_cached_per_configuration(manager, name):
    from quantweave._modules.derive import exported_probe, probe_stats

    exported_probe("linear")  # torch.export warmed up: the time below is the vendor's
    quantizer = manager.get_quantizer(name)
    start = time.perf_counter()
    caps = derive_capabilities(quantizer)
    seconds = time.perf_counter() - start
    assert caps, f"{name}: probing derived nothing; left out: {probe_stats(quantizer)}"
    assert {c.source for c in caps} == {"derived"}
    assert seconds < 120, f"{name}: probing took {seconds:.1f} s"
    again = manager.get_quantizer(name)  # a new object, configured alike: the cache answers
    start = time.perf_counter()
    assert derive_capabilities(again) is caps
    assert time.perf_counter() - start < 1.0
    print(f"\n{name}: {len(caps)} derived capabilities in {seconds:.2f} s ({probe_stats(quantizer)})")


def test_another_configuration_is_derived_again(manager):
    per_channel = derive_capabilities(manager.get_quantizer("executorch-xnnpack"))
    per_tensor = derive_capabilities(manager.get_quantizer("executorch-xnnpack", is_per_channel=False))
    conv = {c.pattern: c for c in per_tensor}["conv2d"]
    assert per_tensor is not per_channel and conv.weight is not None and conv.weight.granularity == "per_tensor"
    assert {c.pattern: c for c in per_channel}["conv2d"].weight.granularity == "per_channel"


def test_composition_merges_derived_capabilities(manager):
    composed = qw.ComposableQuantizer([manager.get_quantizer("executorch-vulkan"), manager.get_quantizer("xnnpack")])
    rows = {(r.pattern, r.mode.value): r for r in composed.capability_table()}
    assert rows[("linear", "dynamic")].served_by == "executorch-vulkan"
    assert rows[("linear", "dynamic")].capability.source == "derived"
    assert rows[("conv2d", "static")].served_by == "xnnpack"  # declared by xnnpack, which Vulkan leaves alone


class _Subset:
    """The vendors plugin restricted to two quantizers (the CLI derives every mode of every
    quantizer it lists; two keep the test short)."""

    QUANTWEAVE_PLUGIN_API = 2

    @hookimpl
    def quantweave_quantizers(self):
        return [i for i in vendors_plugin.quantweave_quantizers() if i.name in ("executorch-vulkan", "litert-pt2e")]


def test_cli_shows_derived_capabilities(capsys):
    pm = PluginManager(entry_points=[], strict=False)
    assert pm.register("vendors", _Subset()).status == "loaded"
    assert main(["capabilities", "--plugin", "vendors", "--json"], manager=pm) == 0
    out = capsys.readouterr().out
    records = json.loads(out[out.index("[") :])  # after anything a vendor printed
    assert records and {r["source"] for r in records} == {"derived"}
    assert {(r["quantizer"], r["pattern"], r["mode"]) for r in records} >= {
        ("executorch-vulkan", "linear", "dynamic"),
        ("litert-pt2e", "conv2d", "static"),
    }
    assert main(["capabilities", "--plugin", "vendors"], manager=pm) == 0
    out = capsys.readouterr().out
    assert "static*" in out and "dynamic*" in out and "*: derived by probing" in out


@pytest.fixture(scope="module")
def fresh_process() -> tuple[list, list, str, list]:
    """One fresh interpreter (a subprocess: this one has imported every vendor) that first
    loads the plugin and lists its quantizers, recording which heavy modules that imported,
    then builds litert-torch's quantizer and records which litert_torch modules are loaded:
    the second step comes after the first, so it cannot hide what loading the plugin did."""
    code = (
        "import sys, json\n"
        "from quantweave.registry import PluginManager\n"
        "import quantweave_vendors.plugin as p\n"
        "pm = PluginManager(entry_points=[], strict=False)\n"
        "pm.register('vendors', p)\n"
        "names = sorted(pm.quantizer_infos())\n"
        "heavy = ('executorch', 'torchao', 'nncf', 'openvino', 'litert_torch', 'tosa_serializer')\n"
        "imported = [m for m in heavy if m in sys.modules]\n"
        "from quantweave_vendors._vendors import BY_NAME\n"
        "q = BY_NAME['litert-pt2e'].build()\n"
        "litert = sorted(m for m in sys.modules if m.startswith('litert_torch'))\n"
        "print(json.dumps([names, imported, type(q).__module__, litert]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    names, imported, module, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return names, imported, module, loaded


def test_loading_the_plugin_imports_no_vendor_package(fresh_process):
    names, imported, _, _ = fresh_process
    assert len(names) == len(VENDORS) and imported == []


def test_litert_quantizer_is_imported_past_the_package_init(fresh_process):
    _, _, module, loaded = fresh_process
    assert module == "litert_torch.quantize.pt2e_quantizer"
    # only the quantizer module and the helpers it imports: litert_torch/__init__ (the converter
    # stack) never ran, and no bare parent package is left behind
    assert loaded == ["litert_torch.quantize.pt2e_quantizer", "litert_torch.quantize.pt2e_quantizer_utils"]


GUARDS = (
    "Cortex-M's passes reject the _guards_fn call_module node that ExportedProgram.module() inserts, under torchao "
    "too (ExportPassBaseError 'call_module is not supported'); .module(check_guards=False) avoids it"
)


def _guarded_mlp() -> tuple[torch.fx.GraphModule, torch.nn.Module, tuple[torch.Tensor, ...]]:
    make_model, make_input = MODELS["mlp"]
    model, args = make_model().eval(), make_input()
    return torch.export.export(model, args).module(), model, args


@pytest.mark.xfail(strict=True, reason=GUARDS)
def test_cortex_m_on_a_guarded_export(manager):
    gm, _, _ = _guarded_mlp()
    qw.prepare_pt2e(gm, manager.get_quantizer("executorch-cortex-m"))


def test_cortex_m_on_a_guarded_export_fails_in_torchao_too_and_ours_says_where(manager):
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    gm, model, args = _guarded_mlp()
    assert any(n.op == "call_module" and n.target == "_guards_fn" for n in gm.graph.nodes)
    with pytest.raises(Exception) as theirs:
        prepare_pt2e(gm, BY_NAME["executorch-cortex-m"].build())
    with pytest.raises(type(theirs.value)) as ours:
        qw.prepare_pt2e(torch.export.export(model, args).module(), manager.get_quantizer("executorch-cortex-m"))
    # the vendor's own message, plus where it came from: the quantizer and the hook
    assert "_guards_fn" in str(ours.value) and "_guards_fn" in str(theirs.value)
    notes = " ".join(getattr(ours.value, "__notes__", []))
    assert "executorch-cortex-m" in notes and "transform_for_annotation" in notes

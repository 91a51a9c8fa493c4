"""to_onnx's exporter shim (tox env ``onnxruntime``): the registry built once per process, no
progress lines printed, the same ONNX model as the public ``torch.onnx.export``, and a loud
failure here when torch changes the private exporter API the shim uses."""

import pytest
import torch

import quantweave as qw
from quantweave_onnxruntime import ORTQuantizer, to_onnx
from quantweave_onnxruntime.testing import MLP

onnx = pytest.importorskip("onnx", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")
pytest.importorskip("onnxscript", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")
from onnx import numpy_helper  # noqa: E402
from onnxscript.rewriter import RewritePass  # noqa: E402
from torch.onnx._internal.exporter import _registration  # noqa: E402

from quantweave_onnxruntime import _torch_onnx_compat  # noqa: E402

pytestmark = pytest.mark.onnxruntime


@pytest.fixture(scope="module")
def converted():
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(8, 64)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), ORTQuantizer())
    qw.calibrate(prepared, [torch.randn(8, 64) for _ in range(2)], progress=False)
    return qw.convert_pt2e(prepared), x


def _graph(path):
    """The graph without the exporter's per-node metadata (stack traces, names of scopes)."""
    graph = onnx.load(str(path)).graph
    for node in graph.node:
        del node.metadata_props[:]
    return graph.SerializeToString()


def _content(path):
    graph = onnx.load(str(path)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    return [n.op_type for n in graph.node], inits


def test_the_private_exporter_api_the_shim_uses_is_there_on_this_torch():
    # fails when a torch release moves ONNXRegistry.from_torchlib or _core.export(registry=...):
    # to_onnx then still works (public torch.onnx.export) but rebuilds the registry on every call
    assert _torch_onnx_compat.fast_path_missing() is None, _torch_onnx_compat.fast_path_missing()


def test_to_onnx_builds_the_registry_and_decomposition_tables_once_is_silent_and_writes_what_the_public_exporter_writes(
    converted, tmp_path, monkeypatch, capfd
):
    from torch.export import exported_program
    from torch.onnx._internal.exporter import _decomp

    gm, x = converted
    builds = []
    original = _registration.ONNXRegistry.__dict__["from_torchlib"].__func__

    def counted(cls, *args, **kwargs):
        builds.append(kwargs.get("opset_version"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", classmethod(counted))
    _torch_onnx_compat._registry.cache_clear()
    # an op library registered after the registry was built (as quantized_decomposed is when a
    # float model is exported before any quantization code ran) gets a new registry
    assert _torch_onnx_compat.registry(20) is _torch_onnx_compat.registry(20) and len(builds) == 1
    library = torch.library.Library("qw_test_ort_export", "DEF")
    library.define("noop(Tensor x) -> Tensor")
    assert _torch_onnx_compat.registry(20) is _torch_onnx_compat.registry(20) and len(builds) == 2
    _torch_onnx_compat._registry.cache_clear()
    builds.clear()
    capfd.readouterr()
    # the exporter's decomposition table and torch's CompositeImplicitAutograd op set: once per process
    tables, collections_ = [], []
    make_table = _decomp.create_onnx_friendly_decomposition_table
    collect = exported_program._collect_all_valid_cia_ops
    monkeypatch.setattr(
        _decomp, "create_onnx_friendly_decomposition_table", lambda ops: tables.append(1) or make_table(ops)
    )
    monkeypatch.setattr(exported_program, "_collect_all_valid_cia_ops", lambda: collections_.append(1) or collect())
    monkeypatch.setattr(_torch_onnx_compat, "_DECOMPOSITION_TABLES", {})
    monkeypatch.setattr(_torch_onnx_compat, "_CIA_OPS", {})
    patched = (_decomp.create_onnx_friendly_decomposition_table, exported_program._collect_all_valid_cia_ops)
    rewrites = []
    rewrite_call = RewritePass.call
    monkeypatch.setattr(RewritePass, "call", lambda self, model: rewrites.append(1) or rewrite_call(self, model))
    first = to_onnx(gm, (x,), tmp_path / "first.onnx", fold_relu=False)
    assert not rewrites  # the default optimizer ("fold") skips onnxscript's pattern rewriter
    second = to_onnx(gm, (x,), tmp_path / "second.onnx", fold_relu=False, optimizer="full")
    assert rewrites  # "full": torch.onnx.export's own optimizer, the rewriter included
    assert len(builds) == 1, builds
    assert (len(tables), len(collections_)) == (1, 1)  # the second export reused both
    # outside to_onnx torch's functions are its own again
    assert (_decomp.create_onnx_friendly_decomposition_table, exported_program._collect_all_valid_cia_ops) == patched
    assert capfd.readouterr().out == ""  # the exporter's "[torch.onnx] ..." progress lines: not printed
    assert _graph(first) == _graph(second)  # the rewriter changes nothing on this Q/DQ graph

    # the public path (taken where the private API is missing) writes the same model, and says why
    monkeypatch.setattr(_torch_onnx_compat, "fast_path_missing", lambda: "ONNXRegistry.from_torchlib is missing")
    with pytest.warns(RuntimeWarning, match="from_torchlib is missing"):
        public = to_onnx(gm, (x,), tmp_path / "public.onnx", fold_relu=False)
    assert len(builds) == 2  # torch.onnx.export built its own
    ops, inits = _content(first)
    public_ops, public_inits = _content(public)
    assert ops == public_ops and "QuantizeLinear" in ops
    assert inits.keys() == public_inits.keys()
    assert all(inits[k].dtype == public_inits[k].dtype and (inits[k] == public_inits[k]).all() for k in inits)


def test_an_unknown_optimizer_is_named(converted, tmp_path):
    gm, x = converted
    with pytest.raises(ValueError, match=r"optimizer.*'fast'"):
        to_onnx(gm, (x,), tmp_path / "m.onnx", optimizer="fast")  # type: ignore[arg-type]
    assert not (tmp_path / "m.onnx").exists()


def test_the_reused_tables_key_sees_an_op_packet_first_reached_between_exports():
    """torch's CIA-op collection walks only the op packets materialized in ``torch.ops``: an op
    first reached from Python changes its answer without changing any registration count, and
    the key of the reused tables must change with it."""
    from quantweave_onnxruntime import _torch_onnx_compat

    lib = torch.library.Library("qw_reuse_key", "DEF")
    try:
        lib.define("probe(Tensor x) -> Tensor")
        before = _torch_onnx_compat._registrations()
        assert torch.ops.qw_reuse_key.probe is not None  # reached from Python: materialized
        after = _torch_onnx_compat._registrations()
        assert before[:3] == after[:3]  # no registration count moved
        assert before != after
    finally:
        lib._destroy()

"""to_onnx's exporter shim (tox env ``onnxruntime``): the registry built once per process, no
progress lines printed, the same ONNX model as the public ``torch.onnx.export``, and a loud
failure here when torch changes the private exporter API the shim uses."""

import pytest
import torch

import quantweave as qw
from quantweave_onnxruntime import ORTQuantizer, to_onnx
from quantweave_onnxruntime.testing import CNN, MLP

onnx = pytest.importorskip("onnx", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")
pytest.importorskip("onnxscript", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")
from onnx import numpy_helper  # noqa: E402
from onnxscript.rewriter import RewritePass  # noqa: E402
from torch.onnx._internal.exporter import _registration  # noqa: E402

from quantweave_onnxruntime import _program, _torch_onnx_compat  # noqa: E402

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
    # the exporter's own capture and decomposition (where _program builds no program of the graph)
    monkeypatch.setattr(_program, "exported_program", lambda model, args: None)
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


@pytest.fixture(scope="module")
def converted_cnn():
    """A CNN whose adaptive_avg_pool2d has no ONNX translation and whose flatten torch decomposes."""
    torch.manual_seed(0)
    model = CNN(channels=4).eval()
    x = torch.randn(2, 3, 16, 16)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), ORTQuantizer())
    qw.calibrate(prepared, [torch.randn(2, 3, 16, 16) for _ in range(2)], progress=False)
    return qw.convert_pt2e(prepared), x


def _counting(monkeypatch):
    """Counts of torch.export.export and ExportedProgram.run_decompositions calls (the exporter's
    second trace of the converted module, and its whole-graph decomposition)."""
    from torch.export import ExportedProgram

    calls = {"export": 0, "run_decompositions": 0}
    export, decompose = torch.export.export, ExportedProgram.run_decompositions

    def counted_export(*args, **kwargs):
        calls["export"] += 1
        return export(*args, **kwargs)

    def counted_decompose(self, *args, **kwargs):
        calls["run_decompositions"] += 1
        return decompose(self, *args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted_export)
    monkeypatch.setattr(ExportedProgram, "run_decompositions", counted_decompose)
    return calls


def _run(path, x):
    from quantweave_onnxruntime import ort_session

    session = ort_session(path, intra_op_threads=1)
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def test_to_onnx_hands_the_converted_graph_over_without_tracing_or_decomposing_it_again(
    converted_cnn, tmp_path, monkeypatch
):
    gm, x = converted_cnn
    code, state = gm.code, {k: (v, v.clone()) for k, v in gm.state_dict(keep_vars=True).items()}
    metas = {n.name: dict(n.meta) for n in gm.graph.nodes}
    calls = _counting(monkeypatch)
    fast = to_onnx(gm, (x,), tmp_path / "fast.onnx")
    # no second torch.export of the converted module, no whole-graph decomposition (the CNN's
    # adaptive_avg_pool2d and flatten are decomposed alone, as torch's decomposition does them)
    assert calls == {"export": 0, "run_decompositions": 0}
    with monkeypatch.context() as m:
        m.setattr(_program, "exported_program", lambda model, args: None)
        captured = to_onnx(gm, (x,), tmp_path / "captured.onnx")
    assert calls == {"export": 1, "run_decompositions": 1}  # the exporter's own path, as before
    ops, inits = _content(fast)
    captured_ops, captured_inits = _content(captured)
    assert ops == captured_ops and "QuantizeLinear" in ops and "Flatten" not in ops
    assert inits.keys() == captured_inits.keys()
    assert all(inits[k].dtype == captured_inits[k].dtype and (inits[k] == captured_inits[k]).all() for k in inits)
    outputs = [[o.name for o in onnx.load(str(path)).graph.output] for path in (fast, captured)]
    assert outputs[0] == outputs[1]  # named as the exporter's capture names them
    assert (_run(fast, x) == _run(captured, x)).all()
    # the caller's module: same code, same tensors (identity and values), node metadata untouched
    assert gm.code == code
    assert all(gm.state_dict(keep_vars=True)[k] is v and torch.equal(v, before) for k, (v, before) in state.items())
    assert {n.name: dict(n.meta) for n in gm.graph.nodes}.keys() == metas.keys()
    assert all(dict(n.meta).keys() == metas[n.name].keys() for n in gm.graph.nodes)


def test_to_onnx_falls_back_to_the_exporters_capture_where_the_program_path_fails(converted_cnn, tmp_path, monkeypatch):
    gm, x = converted_cnn
    calls = _counting(monkeypatch)
    # a graph whose nodes cannot all be decomposed alone: the whole program is decomposed, untraced
    monkeypatch.setattr(_program, "decompose_nodes", lambda *args: False)
    decomposed = to_onnx(gm, (x,), tmp_path / "decomposed.onnx")
    assert calls == {"export": 0, "run_decompositions": 1}

    def broken(model, args):
        raise RuntimeError("not a graph this torch can take")

    monkeypatch.setattr(_program, "exported_program", broken)
    captured = to_onnx(gm, (x,), tmp_path / "captured.onnx")
    assert calls == {"export": 1, "run_decompositions": 2}
    assert _content(decomposed)[0] == _content(captured)[0]
    assert (_run(decomposed, x) == _run(captured, x)).all()


def test_the_program_builder_names_what_it_does_not_take(converted):
    gm, x = converted
    assert _program.unsupported(gm, (x,)) is None
    assert "Linear" in _program.unsupported(torch.nn.Linear(2, 2), (x,))
    assert "2 tensors" not in _program.unsupported(gm, (x, x)) and "1 tensors" in _program.unsupported(gm, (x, x))
    traced = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    assert "'0'" in _program.unsupported(traced, (x,))  # the node calling submodule "0"
    assert _program.exported_program(traced, (x,)) is None

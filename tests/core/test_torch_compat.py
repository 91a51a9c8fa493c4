"""The private / deprecated torch API quantweave depends on, shim by shim.

Every such dependency goes through ``quantweave/_modules/torch_compat.py``. Each test here
checks that the torch API a shim relies on still exists and still behaves as the core
needs; on a torch that changed it, the failure names the API and the shim to adapt.
"""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.ao.quantization.fake_quantize as torch_fake_quantize
import torch.ao.quantization.observer as torch_observer
from torch.fx import Graph, GraphModule

from quantweave._modules import torch_compat
from quantweave._modules.graph import copy_graph_module
from tests.helpers import count_code_generations

SHIMS = "core/src/quantweave/_modules/torch_compat.py"


def changed(api: str, shim: str, detail: str) -> str:
    return f"torch changed {api}: {detail}. Adapt {shim} in {SHIMS} (and keep this test in step)."


# -- 1. quantized_decomposed_ops -------------------------------------------------------------

OPS_CONVERT_EMITS = {
    "quantize_per_tensor": ("default", "tensor"),
    "dequantize_per_tensor": ("default", "tensor"),
    "quantize_per_channel": ("default",),
    "dequantize_per_channel": ("default",),
    "choose_qparams": ("tensor",),
    "choose_qparams_symmetric": ("tensor",),
}


def test_quantized_decomposed_ops_are_registered_by_the_shim():
    """In a fresh interpreter: after the shim, every op convert emits exists."""
    code = textwrap.dedent(
        f"""
        import torch
        from quantweave._modules.torch_compat import quantized_decomposed_ops
        qd = quantized_decomposed_ops()
        assert qd is torch.ops.quantized_decomposed, qd
        missing = [
            f"{{name}}.{{overload}}"
            for name, overloads in {OPS_CONVERT_EMITS!r}.items()
            for overload in overloads
            if not hasattr(getattr(qd, name, None), overload)
        ]
        print(",".join(missing))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, changed(
        "the private module torch.ao.quantization.fx._decomposed",
        "quantized_decomposed_ops()",
        f"importing it no longer registers torch.ops.quantized_decomposed:\n{result.stderr[-2000:]}",
    )
    missing = result.stdout.strip()
    assert not missing, changed(
        "torch.ops.quantized_decomposed", "quantized_decomposed_ops()", f"these ops are gone: {missing}"
    )


def test_quantized_decomposed_ops_take_the_arguments_convert_passes():
    qd = torch_compat.quantized_decomposed_ops()
    api = "torch.ops.quantized_decomposed (argument order / semantics)"
    shim = "quantized_decomposed_ops() and convert.py's calls"
    x = torch.tensor([[-1.0, 0.0, 0.26, 3.0], [0.5, -0.5, 10.0, -10.0]])
    scale, zero_point = 0.05, 3

    def reference(values, s, zp, lo, hi):
        return torch.clamp(torch.round(values / s) + zp, lo, hi)

    # per tensor, literal and tensor qparams: (input, scale, zero_point, quant_min, quant_max, dtype)
    expected = reference(x, scale, zero_point, -128, 127).to(torch.int8)
    q = qd.quantize_per_tensor.default(x, scale, zero_point, -128, 127, torch.int8)
    assert q.dtype == torch.int8 and torch.equal(q, expected), changed(api, shim, f"quantize_per_tensor gave {q}")
    q_t = qd.quantize_per_tensor.tensor(x, torch.tensor(scale), torch.tensor(zero_point), -128, 127, torch.int8)
    assert torch.equal(q_t, expected), changed(api, shim, f"quantize_per_tensor.tensor gave {q_t}")
    dq = qd.dequantize_per_tensor.default(q, scale, zero_point, -128, 127, torch.int8, out_dtype=torch.bfloat16)
    assert dq.dtype == torch.bfloat16, changed(api, shim, f"dequantize_per_tensor ignored out_dtype: {dq.dtype}")
    torch.testing.assert_close(dq.float(), ((expected.float() - zero_point) * scale).bfloat16().float())
    dq_t = qd.dequantize_per_tensor.tensor(q, torch.tensor(scale), torch.tensor(zero_point), -128, 127, torch.int8)
    torch.testing.assert_close(dq_t, (expected.float() - zero_point) * scale)

    # per channel: (input, scales, zero_points, axis, quant_min, quant_max, dtype)
    scales, zero_points = torch.tensor([0.1, 0.02]), torch.tensor([0, 10])
    qc = qd.quantize_per_channel.default(x, scales, zero_points, 0, 0, 255, torch.uint8)
    expected_c = reference(x, scales[:, None], zero_points[:, None], 0, 255).to(torch.uint8)
    assert torch.equal(qc, expected_c), changed(api, shim, f"quantize_per_channel (axis 0) gave {qc}")
    dqc = qd.dequantize_per_channel.default(qc, scales, zero_points, 0, 0, 255, torch.uint8)
    torch.testing.assert_close(dqc, (expected_c.float() - zero_points[:, None]) * scales[:, None])

    # dynamic: (input, quant_min, quant_max, eps, dtype) -> (scale, zero_point)
    s, zp = qd.choose_qparams.tensor(x, 0, 255, torch.finfo(torch.float32).eps, torch.uint8)
    q_dyn = qd.quantize_per_tensor.tensor(x, s, zp, 0, 255, torch.uint8)
    roundtrip = qd.dequantize_per_tensor.tensor(q_dyn, s, zp, 0, 255, torch.uint8)
    assert float(s) == pytest.approx(20.0 / 255, rel=1e-6), changed(api, shim, f"choose_qparams scale {s}")
    assert float((roundtrip - x).abs().max()) <= float(s) / 2 + 1e-6, changed(
        api, shim, f"choose_qparams gave {s}, {zp}: the range [-10, 10] does not round-trip"
    )
    s_sym, zp_sym = qd.choose_qparams_symmetric.tensor(x, -128, 127, torch.finfo(torch.float32).eps, torch.int8)
    assert int(zp_sym) == 0 and float(s_sym) > 0, changed(api, shim, f"choose_qparams_symmetric gave {s_sym}, {zp_sym}")


# -- 2. empty_graph_like -------------------------------------------------------------------------


class Structured(torch.nn.Module):
    """Pytree inputs and outputs: what the exported module's code generator carries."""

    def forward(self, x, extra):
        return {"sum": x + extra["y"], "pair": (x * 2, extra["y"] - 1)}


def test_graph_private_attributes_used_by_empty_graph_like_exist():
    graph = Graph()
    for name in ("_tracer_cls", "_codegen"):
        assert hasattr(graph, name), changed(f"torch.fx.Graph.{name}", "empty_graph_like()", "the attribute is gone")
    assert callable(getattr(Graph, "set_codegen", None)), changed(
        "torch.fx.Graph.set_codegen", "empty_graph_like()", "the method is gone"
    )
    params = inspect.signature(Graph.__init__).parameters
    assert "tracer_cls" in params, changed("torch.fx.Graph(tracer_cls=...)", "empty_graph_like()", str(params))


def test_empty_graph_like_keeps_the_pytree_specs_of_an_exported_module():
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    exported = torch.export.export(Structured(), (x, {"y": y})).module()
    new = torch_compat.empty_graph_like(exported.graph)
    assert new._tracer_cls is exported.graph._tracer_cls, changed(
        "torch.fx.Graph(tracer_cls=...)", "empty_graph_like()", "the new graph has another tracer class"
    )
    assert new._codegen is exported.graph._codegen, changed(
        "torch.fx.Graph.set_codegen / ._codegen", "empty_graph_like()", "the code generator was not carried over"
    )
    assert not list(new.nodes), "the new graph is empty"
    new.output(new.graph_copy(exported.graph, {}))
    copy_module = GraphModule(exported, new)
    got, expected = copy_module(x, {"y": y}), exported(x, {"y": y})
    detail = f"a copy over empty_graph_like() returned {type(got).__name__} {got!r}, not the exported structure"
    assert isinstance(got, dict) and got.keys() == {"sum", "pair"}, changed(
        "torch.fx.Graph._codegen", "empty_graph_like()", detail
    )
    torch.testing.assert_close(got, expected)
    # the engine's copy (which builds on the shim) is called like the exported module too
    copied, _ = copy_graph_module(exported)
    torch.testing.assert_close(copied(x, {"y": y}), expected)


# -- 3. lazy_graph_module ------------------------------------------------------------------------


def test_lazy_graph_module_generates_code_on_first_call(monkeypatch):
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError as exc:  # pragma: no cover - only on a torch that removed it
        pytest.fail(changed("torch.fx._lazy_graph_module._LazyGraphModule", "lazy_graph_module()", str(exc)))
    x = torch.randn(2, 3)
    exported = torch.export.export(Structured(), (x, {"y": x})).module()
    calls = count_code_generations(monkeypatch)
    module = torch_compat.lazy_graph_module(exported, exported.graph)
    assert isinstance(module, _LazyGraphModule) and isinstance(module, GraphModule), changed(
        "torch.fx._lazy_graph_module._LazyGraphModule", "lazy_graph_module()", f"got a {type(module).__name__}"
    )
    assert not calls, changed("_LazyGraphModule", "lazy_graph_module()", "it generated code on construction")
    module.recompile()
    assert not calls, changed("_LazyGraphModule.recompile", "lazy_graph_module()", "recompile() is no longer lazy")
    torch.testing.assert_close(module(x, {"y": x}), exported(x, {"y": x}))
    assert len(calls) == 1, changed("_LazyGraphModule", "lazy_graph_module()", f"{len(calls)} code generations")


def test_deferred_graph_module_is_a_graph_module_a_caller_can_use(monkeypatch):
    """What prepare / convert return: no code until first needed, then one generation; hooks
    once on the first call; forward's signature and _in_spec before any code; recompile() eager."""
    x = torch.randn(2, 3)
    exported = torch.export.export(Structured(), (x, {"y": x})).module()
    copied, _ = copy_graph_module(exported)
    calls = count_code_generations(monkeypatch)
    module = torch_compat.deferred_graph_module(copied, copied.graph, exported)
    assert isinstance(module, GraphModule) and not calls
    assert inspect.signature(module.forward) == inspect.signature(exported.forward) and not calls
    assert module._in_spec == exported._in_spec and not calls
    hooks = []
    module.register_forward_pre_hook(lambda m, a: hooks.append("pre"))
    module.register_forward_hook(lambda m, a, o: hooks.append("post"))
    torch.testing.assert_close(module(x, {"y": x}), exported(x, {"y": x}))
    assert hooks == ["pre", "post"] and len(calls) == 1
    torch.testing.assert_close(module(x, {"y": x}), exported(x, {"y": x}))
    assert hooks == ["pre", "post"] * 2 and len(calls) == 1
    assert module.code == exported.code and len(calls) == 1
    assert module.recompile() is not None and len(calls) == 2  # an edit's recompile: at once, as GraphModule's


def test_deferred_graph_module_is_eager_when_the_signature_is_not_known():
    x = torch.randn(2, 3)
    exported = torch.export.export(Structured(), (x, {"y": x})).module()
    copied, _ = copy_graph_module(exported)
    placeholder = next(iter(copied.graph.find_nodes(op="placeholder")))
    with copied.graph.inserting_after(placeholder):
        copied.graph.placeholder("extra")
    module = torch_compat.deferred_graph_module(copied, copied.graph, exported)
    assert "_code" in vars(module)  # other placeholders than the source's: compiled at once
    with pytest.raises(TypeError, match=r"quantweave\.save"):  # refuses pickling as the deferred ones do
        pickle.dumps(module)


# -- 4. observers and with_observer_kwargs ---------------------------------------------------------

OBSERVER_CLASSES = {
    torch_observer: (
        "FixedQParamsObserver",
        "HistogramObserver",
        "MinMaxObserver",
        "MovingAverageMinMaxObserver",
        "MovingAveragePerChannelMinMaxObserver",
        "ObserverBase",
        "PerChannelMinMaxObserver",
        "PlaceholderObserver",
    ),
    torch_fake_quantize: (
        "FakeQuantize",
        "FakeQuantizeBase",
        "FixedQParamsFakeQuantize",
        "FusedMovingAvgObsFakeQuantize",
    ),
}


def test_observer_classes_come_from_torch_ao_quantization():
    for module, names in OBSERVER_CLASSES.items():
        for name in names:
            assert getattr(torch_compat, name) is getattr(module, name, None), changed(
                f"{module.__name__}.{name}", "the observer imports", "the class is gone or moved"
            )
    params = list(inspect.signature(torch_observer.ObserverBase.__init__).parameters)
    assert params[:3] == ["self", "dtype", "is_dynamic"], changed(
        "ObserverBase.__init__", "DerivedObserver (observers.py)", f"parameters are now {params}"
    )


def test_observers_expose_the_state_convert_and_is_calibrated_read():
    api = "torch.ao.quantization observer attributes"
    shim = "the observer imports (convert.py / observers.is_calibrated read them)"
    minmax = torch_compat.MinMaxObserver(dtype=torch.quint8, quant_min=0, quant_max=127)
    assert float(minmax.min_val) == float("inf") and float(minmax.max_val) == float("-inf"), changed(
        api, shim, "an uncalibrated MinMaxObserver no longer holds min_val=inf, max_val=-inf"
    )
    minmax(torch.tensor([-1.0, 2.0]))
    assert (minmax.dtype, minmax.qscheme, minmax.quant_min, minmax.quant_max, minmax.is_dynamic) == (
        torch.quint8,
        torch.per_tensor_affine,
        0,
        127,
        False,
    ), changed(api, shim, "dtype/qscheme/quant_min/quant_max/is_dynamic")
    scale, zero_point = minmax.calculate_qparams()
    torch.testing.assert_close(scale, torch.tensor([3.0 / 127]))
    assert int(zero_point) == 42, changed(api, shim, f"calculate_qparams gave zero point {zero_point}")
    per_channel = torch_compat.PerChannelMinMaxObserver(
        ch_axis=1, dtype=torch.qint8, qscheme=torch.per_channel_symmetric
    )
    assert per_channel.min_val.numel() == 0, changed(api, shim, "uncalibrated per-channel min_val is no longer empty")
    per_channel(torch.randn(2, 3))
    assert per_channel.ch_axis == 1 and per_channel.calculate_qparams()[0].shape == (3,)
    placeholder = torch_compat.PlaceholderObserver(dtype=torch.quint8, is_dynamic=True)
    assert placeholder.is_dynamic and isinstance(placeholder.eps, float), changed(api, shim, "PlaceholderObserver.eps")
    fake = torch_compat.FakeQuantize()
    assert isinstance(fake.activation_post_process, torch_compat.ObserverBase), changed(
        api, shim, "FakeQuantize.activation_post_process is no longer its observer"
    )


def test_with_observer_kwargs_chains_torch_partials_with_the_spec_winning():
    api = "torch.ao.quantization.observer._PartialWrapper (what .with_args returns)"
    shim = "with_observer_kwargs()"
    ctr = torch_compat.MinMaxObserver.with_args(dtype=torch.qint8, quant_min=0, quant_max=100)
    build = torch_compat.with_observer_kwargs(ctr, {"dtype": torch.quint8, "quant_max": 127})
    first, second = build(), build()
    assert first is not second, changed(api, shim, "one constructor returned the same instance twice")
    got = (type(first), first.dtype, first.quant_min, first.quant_max)
    assert got == (torch_compat.MinMaxObserver, torch.quint8, 0, 127), changed(
        api, shim, f"chained with_args gave {got}; expected later keywords to win"
    )
    # a plain callable (no with_args) is bound with functools.partial
    plain = torch_compat.with_observer_kwargs(
        lambda **kw: torch_compat.MinMaxObserver(**kw), {"quant_min": 0, "quant_max": 63}
    )
    assert plain().quant_max == 63


# -- 5. HistogramObserverHooks ---------------------------------------------------------------------


def test_histogram_observer_private_search_hooks_exist():
    cls = torch_observer.HistogramObserver
    for name in ("_non_linear_param_search", "_compute_quantization_error"):
        assert callable(getattr(cls, name, None)), changed(
            f"HistogramObserver.{name}", "HistogramObserverHooks", "the private method is gone"
        )
    params = list(inspect.signature(cls._compute_quantization_error).parameters)
    assert params == ["self", "next_start_bin", "next_end_bin"], changed(
        "HistogramObserver._compute_quantization_error", "HistogramObserverHooks", f"parameters are now {params}"
    )


def test_histogram_observer_hooks_route_torch_search_through_search_min_max():
    data = torch.randn(3000, generator=torch.Generator().manual_seed(1)) * 2

    class Fixed(torch_compat.HistogramObserverHooks):
        def search_min_max(self):
            return torch.tensor(-1.0), torch.tensor(1.0)

    fixed = Fixed(dtype=torch.quint8)
    fixed(data)
    scale, _ = fixed.calculate_qparams()
    assert torch.allclose(scale, torch.tensor([2.0 / 255])), changed(
        "HistogramObserver.calculate_qparams", "HistogramObserverHooks", "it no longer calls _non_linear_param_search"
    )
    hooks, plain = (
        torch_compat.HistogramObserverHooks(dtype=torch.quint8),
        torch_observer.HistogramObserver(dtype=torch.quint8),
    )
    hooks(data)
    plain(data)
    (got_scale, got_zp), (want_scale, want_zp) = hooks.calculate_qparams(), plain.calculate_qparams()
    assert torch.equal(got_scale, want_scale) and torch.equal(got_zp, want_zp), (
        "the default search_min_max is torch's own search"
    )
    error = hooks.quantization_error(10, hooks.bins - 10)
    assert isinstance(error, float) and error == plain._compute_quantization_error(10, plain.bins - 10)


# -- 6. rebin_histogram --------------------------------------------------------------------------------


def test_histogram_observer_private_combine_exists():
    method = getattr(torch_observer.HistogramObserver, "_combine_histograms", None)
    assert callable(method), changed("HistogramObserver._combine_histograms", "rebin_histogram()", "it is gone")
    params = list(inspect.signature(method).parameters)
    expected = ["self", "orig_hist", "orig_min", "orig_max", "update_hist", "update_min", "update_max"]
    assert params == expected, changed(
        "HistogramObserver._combine_histograms", "rebin_histogram()", f"parameters are now {params}"
    )


def test_rebin_histogram_is_what_the_observer_does_when_a_batch_widens_its_range():
    gen = torch.Generator().manual_seed(2)
    first, wider = torch.randn(2000, generator=gen), torch.randn(2000, generator=gen) * 3
    observer = torch_observer.HistogramObserver(bins=256)
    observer(first)
    histogram, lo, hi = observer.histogram.clone(), observer.min_val.clone(), observer.max_val.clone()
    observer(wider)  # widens the range: the observer re-bins `histogram` onto it, then adds the batch
    new_lo, new_hi = observer.min_val, observer.max_val
    assert new_lo < lo and new_hi > hi
    rebinned = torch_compat.rebin_histogram(observer, histogram, lo, hi, new_lo, new_hi)
    batch = torch.histc(wider, 256, min=float(new_lo), max=float(new_hi))
    assert torch.equal(batch + rebinned, observer.histogram), changed(
        "HistogramObserver._combine_histograms", "rebin_histogram()", "it no longer re-bins as forward does"
    )
    assert float(rebinned.sum()) == float(histogram.sum()) == 2000.0  # mass is kept
    same = torch_compat.rebin_histogram(observer, histogram, lo, hi, lo, hi)
    assert torch.equal(same, histogram)  # the same range: unchanged
    point = torch_compat.rebin_histogram(observer, torch.full((256,), 0.5), lo, lo, new_lo, new_hi)
    assert float(point.sum()) == 128.0 and int((point > 0).sum()) == 1  # a one-value range: one bin


# -- 8. fake_value -----------------------------------------------------------------------------------


def test_fake_value_is_a_fake_tensor_of_the_graphs_fake_mode():
    gm = torch.export.export(torch.nn.Linear(4, 3).eval(), (torch.randn(2, 4),)).module()
    recorded = next(n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder")
    mode = getattr(recorded, "fake_mode", None)
    assert mode is not None and callable(getattr(mode, "from_tensor", None)), changed(
        "FakeTensor.fake_mode / FakeTensorMode.from_tensor", "fake_value", "torch.export's values have no fake mode"
    )
    value = torch.randn(5, 4, dtype=torch.float64)
    fake = torch_compat.fake_value(gm.graph, value)
    assert type(fake).__name__ == "FakeTensor" and fake.fake_mode is mode
    assert (fake.shape, fake.stride(), fake.dtype, fake.device) == (
        value.shape,
        value.stride(),
        value.dtype,
        value.device,
    )
    assert torch_compat.fake_value(torch.fx.symbolic_trace(torch.nn.ReLU()).graph, value) is None


def test_pt2_packager_has_what_quantweave_save_streams_through():
    """quantweave.save streams weights through torch.export.pt2_archive._package's
    _get_raw_tensor_bytes / PT2ArchiveWriter.write_bytes (_modules/archive_stream): on a
    torch that renamed them, pt2_packager returns None and save no longer streams."""
    from quantweave._modules.torch_compat import pt2_packager

    package = pt2_packager()
    assert package is not None, "torch.export.pt2_archive._package changed: update _modules/torch_compat.pt2_packager"
    assert package._get_raw_tensor_bytes(torch.arange(4, dtype=torch.int8)) == bytes([0, 1, 2, 3])

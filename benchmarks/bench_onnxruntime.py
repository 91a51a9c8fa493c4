"""quantweave-onnxruntime vs ONNX Runtime's own quantizer vs fp32, on ONNX Runtime (issue 28).

Each float model is quantized two ways with the same calibration batches:

- ours: quantweave + ORTQuantizer (torch.export, prepare, calibrate, convert, to_onnx);
- ORT:  the float model exported to ONNX with the same exporter (the public
        ``torch.onnx.export(..., dynamo=True)``, as an ORT user calls it), then ORT's own quantizer:
        static: quant_pre_process + quantize_static (QDQ, per-channel, uint8 activations / int8
        weights, MinMax calibration); dynamic: quantize_dynamic (per-channel int8 weights);

and the three models run on ONNX Runtime's CPU provider (2 intra-op threads). Models:

- cnn:        the issue's CNN (3 convs, residual add, max pool, global average pool, linear;
              batch 8, 64x64);
- mobilenet:  MobileNetV2-like (conv-bn-relu6 stem, 4 inverted residual blocks with depthwise
              convs, global pool, linear; batch 8, 64x64);
- block:      a pre-norm transformer encoder block (d=128, 4 heads, 64 tokens, batch 8;
              projections, attention matmuls, softmax, GELU MLP), static and dynamic;
- bert:       transformers' BertModel from a config (random init, nothing downloaded: 4 layers,
              hidden 128, 4 heads, eager attention; 64 tokens, batch 8), static and dynamic
              (skipped when transformers is not installed).

The models, ORT's side and the measures come from ``quantweave_onnxruntime.testing`` (shared
with tests/onnxruntime). Latencies are medians of interleaved repetitions, the order rotating
(fp32, ours, ORT; ours, ORT, fp32; ...), each session's threads not spinning between runs
(``session.intra_op.allow_spinning=0``: a spinning session slows the next one down).
Quantizing is done ``--quantize-reps`` times each way, interleaved (ours, ORT, ORT, ours, ...),
medians. Printed per model: quantize time (export included), SQNR vs the float
PyTorch model, model size, int8 products / all conv + matmul + gemm products in ORT's optimized
graph, latency and ratios; then where quantize time goes: ours split into torch.export,
prepare, calibrate (``qw.calibrate``), convert, torch.onnx.export and the rest of ``to_onnx``;
ORT's into torch.onnx.export of the float model and ORT's quantizer (quant_pre_process +
quantize_static, or quantize_dynamic); then the CPU's int8 flags and the load average.

    pip install torch==2.13.0 numpy onnx onnxscript onnxruntime transformers ./core ./plugins/onnxruntime
    python benchmarks/bench_onnxruntime.py [--reps 50] [--quantize-reps 3] [--models cnn,mobilenet,block,bert]
        [--observer histogram]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnxruntime as ort
import torch

import quantweave as qw
from quantweave_onnxruntime import ORTQuantizer, _torch_onnx_compat, to_onnx
from quantweave_onnxruntime.testing import (
    BENCH_MODELS,
    cpu_int8_flags,
    ort_quantize_dynamic,
    ort_quantize_static,
    products,
    sqnr,
)

try:  # to_onnx's ONNX optimizer (exporting with optimize=False); absent before it, for before/after runs
    from quantweave_onnxruntime import _optimizer

    _TIMED: tuple[tuple[Any, str], ...] = ((_torch_onnx_compat, "export"), (_optimizer, "optimize"))
except ImportError:
    _TIMED = ((_torch_onnx_compat, "export"),)


def cpu_flags() -> str:
    return " ".join(cpu_int8_flags()) or "unknown"


def kernels(path: Path) -> str:
    int8, floating = products(path)
    return f"{int8}/{int8 + floating}"


class _ExportClock:
    """Times the exporter's calls made inside ``to_onnx`` (its shim over ``torch.onnx.export``:
    capture, decompositions, translation; and the ONNX optimizer ``to_onnx`` runs after it, as
    ``torch.onnx.export`` does inside), the rest of ``to_onnx`` apart."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._saved = [(module, name, getattr(module, name)) for module, name in _TIMED]

    def __enter__(self) -> _ExportClock:
        for module, name, raw in self._saved:

            def timed(*args: Any, _f: Any = raw, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _f(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - start

            setattr(module, name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        for module, name, raw in self._saved:
            setattr(module, name, raw)


def quantize_ours(
    name: str, model: torch.nn.Module, batches: list[torch.Tensor], x: torch.Tensor, dynamic: bool, args: Any, d: Path
) -> tuple[Path, dict[str, float]]:
    """quantweave's path, timed per stage."""
    split: dict[str, float] = {}
    start = time.perf_counter()
    exported = torch.export.export(model, (x,)).module()
    split["torch.export"] = time.perf_counter() - start
    t = time.perf_counter()
    quantizer = ORTQuantizer(is_dynamic=dynamic, reduce_range=args.reduce_range, observer=args.observer)
    prepared = qw.prepare_pt2e(exported, quantizer)
    split["prepare"] = time.perf_counter() - t
    t = time.perf_counter()
    # qw.calibrate: under torch.no_grad, as the README calibrates; dynamic: one pass (weights only are observed)
    qw.calibrate(prepared, batches[: 1 if dynamic else None], progress=False)
    split["calibrate"] = time.perf_counter() - t
    t = time.perf_counter()
    converted = qw.convert_pt2e(prepared)
    split["convert"] = time.perf_counter() - t
    t = time.perf_counter()
    with _ExportClock() as clock:
        ours = to_onnx(converted, (x,), d / f"{name}_ours.onnx")
    split["torch.onnx.export"] = clock.seconds
    split["to_onnx rest"] = time.perf_counter() - t - clock.seconds
    split["total"] = time.perf_counter() - start
    return ours, split


def export_float(model: torch.nn.Module, x: torch.Tensor, path: Path) -> Path:
    """ORT's side exports the float model as an ONNX Runtime user does: the public
    ``torch.onnx.export(..., dynamo=True)`` (which rebuilds the exporter's registry on each call;
    ``to_onnx`` builds it once per process)."""
    program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
    assert program is not None
    program.save(str(path))
    return path


def quantize_ort(
    name: str, model: torch.nn.Module, batches: list[torch.Tensor], x: torch.Tensor, dynamic: bool, args: Any, d: Path
) -> tuple[Path, Path, dict[str, float]]:
    """ORT's path (float export, then quant_pre_process + quantize_static, or quantize_dynamic), timed."""
    split: dict[str, float] = {}
    start = time.perf_counter()
    fp32 = export_float(model, x, d / f"{name}_fp32.onnx")
    split["torch.onnx.export"] = time.perf_counter() - start
    t = time.perf_counter()
    if dynamic:
        _, theirs = ort_quantize_dynamic(fp32, x, d, reduce_range=args.reduce_range, name=name)
    else:
        _, theirs = ort_quantize_static(
            fp32, batches, x, d, pre_process=True, reduce_range=args.reduce_range, name=name
        )
    split["ORT quantize"] = time.perf_counter() - t
    split["total"] = time.perf_counter() - start
    return fp32, theirs, split


def case(
    name: str,
    model: torch.nn.Module,
    make: Callable[[], torch.Tensor],
    dynamic: bool,
    args: Any,
    d: Path,
) -> None:
    torch.manual_seed(1)
    batches = [make() for _ in range(8)]
    x = make()
    model = model.eval()
    to_onnx(model, (x,), d / f"{name}_warmup.onnx")  # untimed: first-export costs of this model
    ours_splits: list[dict[str, float]] = []
    ort_splits: list[dict[str, float]] = []
    for rep in range(args.quantize_reps):  # interleaved, the order alternating
        for side in ("ours", "ORT") if rep % 2 == 0 else ("ORT", "ours"):
            if side == "ours":
                ours, split = quantize_ours(name, model, batches, x, dynamic, args, d)
                ours_splits.append(split)
            else:
                fp32, theirs, split = quantize_ort(name, model, batches, x, dynamic, args, d)
                ort_splits.append(split)
    ours_split = {k: statistics.median(s[k] for s in ours_splits) for k in ours_splits[0]}
    ort_split = {k: statistics.median(s[k] for s in ort_splits) for k in ort_splits[0]}
    ours_time, ort_time = ours_split["total"], ort_split["total"]

    paths = {"fp32": fp32, "ours": ours, "ORT": theirs}
    sessions = {k: _latency_session(p, args.threads or 2) for k, p in paths.items()}
    feed = {sessions["fp32"].get_inputs()[0].name: x.numpy()}
    reference = model(x).detach().numpy()
    outputs = {k: s.run(None, feed)[0] for k, s in sessions.items()}
    for s in sessions.values():
        for _ in range(3):
            s.run(None, feed)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for rep in range(args.reps):  # interleaved, the order rotating (no session always runs after the same one)
        keys = list(sessions)
        for k in keys[rep % 3 :] + keys[: rep % 3]:
            s = sessions[k]
            t = time.perf_counter()
            s.run(None, feed)
            times[k].append(time.perf_counter() - t)
    median = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    quantize = {"fp32": None, "ours": ours_time, "ORT": ort_time}
    label = f"{name} ({'dynamic' if dynamic else 'static'})"
    for k, p in paths.items():
        q = "-" if quantize[k] is None else f"{quantize[k]:.2f}"
        s = "-" if k == "fp32" else f"{sqnr(reference, outputs[k]):.2f}"
        kern = "-" if k == "fp32" else kernels(p)
        print(f"{label:20} {k:5} {q:>10} {s:>8} {p.stat().st_size / 1024:9.1f} {kern:>9} {median[k]:10.3f}")
    print(
        f"{label:20} ratios: ours/ORT latency {median['ours'] / median['ORT']:.3f}x, fp32/ours "
        f"{median['fp32'] / median['ours']:.2f}x, fp32/ORT {median['fp32'] / median['ORT']:.2f}x, "
        f"quantize time ours/ORT {ours_time / ort_time:.2f}x; load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    ours_text = ", ".join(f"{k} {v:.2f}" for k, v in ours_split.items() if k != "total")
    ort_text = ", ".join(f"{k} {v:.2f}" for k, v in ort_split.items() if k != "total")
    exporter = ours_split["torch.onnx.export"]
    print(
        f"{label:20} quantize split, s (median of {args.quantize_reps}): ours {ours_text} | ORT {ort_text}; "
        f"ours without torch.onnx.export / ORT without it: {ours_time - exporter:.2f} / "
        f"{ort_time - ort_split['torch.onnx.export']:.2f}",
        flush=True,
    )


def _latency_session(path: Path, threads: int) -> ort.InferenceSession:
    """A session for the latency rounds: ``threads`` intra-op threads that do not spin once a run
    ends. Three sessions take turns on the same cores; with ORT's default (spinning on), the
    threads of the session that just ran keep spinning while the next one runs and slow it down
    by a factor that depends on the order (session 5: "1.67x" for an int8 MobileNet whose
    optimized graph is node for node quantize_static's)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class _PhaseClock:
    """CPU seconds (``time.process_time``: every thread of this process) per phase of
    ``torch.onnx.export``, from timers put around the exporter's steps for the profile only
    (its registry build, the capture of the module with torch.export, decompositions,
    translation to ONNX, the optimizer, serialization); "capture" is the export's rest. Ours:
    "program" is ``to_onnx`` building the ExportedProgram from the converted graph (no capture;
    absent before it), "decompose" then type promotion and the nodes decomposed alone."""

    STEPS = (
        ("registry", "torch.onnx._internal.exporter._registration", "ONNXRegistry", "from_torchlib"),
        ("program", "quantweave_onnxruntime._program", None, "exported_program"),
        ("decompose", "torch.onnx._internal.exporter._core", None, "_prepare_exported_program_for_export"),
        ("translate", "torch.onnx._internal.exporter._core", None, "_exported_program_to_onnx_program"),
        ("optimize", "torch.onnx._internal.exporter._onnx_program", "ONNXProgram", "optimize"),
        ("optimize", "quantweave_onnxruntime._optimizer", None, "optimize"),  # to_onnx's ("fold": no nesting)
        ("save", "torch.onnx._internal.exporter._onnx_program", "ONNXProgram", "save"),
    )

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> _PhaseClock:
        import importlib

        for label, module_name, owner_name, attribute in self.STEPS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # to_onnx's optimizer / program modules, before they existed
                continue
            owner = getattr(module, owner_name) if owner_name else module
            raw = owner.__dict__[attribute] if owner_name else getattr(owner, attribute)
            self._saved.append((owner, attribute, raw))
            wrapped = raw.__func__ if isinstance(raw, classmethod) else raw

            def timed(*args: Any, _f: Any = wrapped, _label: str = label, **kwargs: Any) -> Any:
                start = time.process_time()
                try:
                    return _f(*args, **kwargs)
                finally:
                    self.seconds[_label] = self.seconds.get(_label, 0.0) + time.process_time() - start

            setattr(owner, attribute, classmethod(timed) if isinstance(raw, classmethod) else timed)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attribute, raw in reversed(self._saved):
            setattr(owner, attribute, raw)


def profile(names: list[str], args: Any) -> None:
    """CPU seconds per phase of one quantize each way (after one untimed warm-up of each path
    in this process, so neither pays the first-import costs), per model."""
    import quantweave_onnxruntime.testing as testing

    def clock() -> float:
        return time.process_time()

    for name in names:
        factory, make = BENCH_MODELS[name]
        torch.manual_seed(0)
        try:
            model = factory().eval()
        except ImportError as error:
            print(f"{name}: skipped ({error})")
            continue
        torch.manual_seed(1)
        batches = [make() for _ in range(8)]
        x = make()
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            first: tuple[float, float] = (0.0, 0.0)
            ours: dict[str, float] = {}
            theirs: dict[str, float] = {}
            for rep in range(2):  # the first pays the process's first-call costs (printed apart)
                if rep == 1:
                    first = (sum(ours.values()), sum(theirs.values()))
                ours = {}
                t = clock()
                exported = torch.export.export(model, (x,)).module()
                ours["torch.export"] = clock() - t
                t = clock()
                quantizer = ORTQuantizer(reduce_range=args.reduce_range, observer=args.observer)
                prepared = qw.prepare_pt2e(exported, quantizer)
                ours["prepare"] = clock() - t
                t = clock()
                qw.calibrate(prepared, batches, progress=False)
                ours["calibrate"] = clock() - t
                t = clock()
                converted = qw.convert_pt2e(prepared)
                ours["convert"] = clock() - t
                t = clock()
                with _PhaseClock() as phases:
                    to_onnx(converted, (x,), d / f"{name}_ours.onnx")
                total = clock() - t
                ours.update({f"to_onnx:{k}": v for k, v in phases.seconds.items()})
                ours["to_onnx:capture+rest"] = total - sum(phases.seconds.values())
                theirs = {}
                t = clock()
                with _PhaseClock() as phases:
                    fp32 = export_float(model, x, d / f"{name}_fp32.onnx")
                total = clock() - t
                theirs.update({f"export:{k}": v for k, v in phases.seconds.items()})
                theirs["export:capture+rest"] = total - sum(phases.seconds.values())
                t = clock()
                testing.ort_quantize_static(fp32, batches, x, d, pre_process=True, reduce_range=args.reduce_range)
                theirs["quant_pre_process+quantize_static"] = clock() - t
            ours_total, theirs_total = sum(ours.values()), sum(theirs.values())
            print(f"{name} (static), CPU s, {torch.get_num_threads()} torch thread(s), observer {args.observer}:")
            print("  ours: " + ", ".join(f"{k} {v:.2f}" for k, v in ours.items()) + f"; total {ours_total:.2f}")
            print("  ORT:  " + ", ".join(f"{k} {v:.2f}" for k, v in theirs.items()) + f"; total {theirs_total:.2f}")
            print(
                f"  ours/ORT {ours_total / theirs_total:.2f}x (first call in the process: ours {first[0]:.2f}, "
                f"ORT {first[1]:.2f}); load {os.getloadavg()[0]:.2f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--quantize-reps", type=int, default=1, help="quantize each way this many times, interleaved")
    parser.add_argument("--models", default="cnn,mobilenet,block,bert")
    parser.add_argument(
        "--observer",
        choices=("minmax", "histogram"),
        default="minmax",
        help="activation observer (the plugin's default: minmax)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="CPU seconds per quantize phase each way (static), then stop"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    flags = cpu_flags()
    # no VNNI: u8 x s8 kernels saturate with full-range weights; ORT's advice is reduce_range (both get it)
    args.reduce_range = not any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))
    print(
        f"CPU int8 flags: {flags}; reduce_range={args.reduce_range}; "
        f"onnxruntime {ort.__version__}, torch {torch.__version__}"
    )
    print(
        f"{args.reps} reps, 2 intra-op threads, activation observer {args.observer}; "
        f"load average before {os.getloadavg()[0]:.2f}"
    )
    print(f"{'model':20} {'':5} {'quantize s':>10} {'SQNR dB':>8} {'size KB':>9} {'int8 prod':>9} {'latency ms':>10}")
    wanted = args.models.split(",")
    unknown = [m for m in wanted if m not in BENCH_MODELS]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; known: {', '.join(BENCH_MODELS)}")
    if args.profile:
        profile(wanted, args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name in wanted:
            factory, make = BENCH_MODELS[name]
            torch.manual_seed(0)
            try:
                model = factory()
            except ImportError as error:
                print(f"{name}: skipped ({error})")
                continue
            for dynamic in (False, True) if name in ("block", "bert") else (False,):
                case(name, model, make, dynamic, args, d)
    print(f"load average after {os.getloadavg()[0]:.2f} (2 cores)")


if __name__ == "__main__":
    main()

"""8da4w on XNNPACK: ExecuTorch's own path (torchao source transform) vs quantweave's PT2E path.

Needs ExecuTorch 1.5.1 and torchao 0.18 (installed as in plugins/executorch/README.md:
``--no-deps``). Same model for both: ``quantweave.testing.models.tiny_decoder_lm()`` (vocab
32000, dim 128, 2 layers, untied head; ``--quick``: vocab 4096). Both quantize every linear
to 8da4w (int8 activations per token, chosen at run time; int4 symmetric weights in groups of
``--group-size``) and the token table to 4-bit group-wise (same group size), then lower with
``to_edge_transform_and_lower`` + ``XnnpackPartitioner``:

- ``anchor``: torchao 0.18 ``quantize_(model, Int8DynamicActivationIntxWeightConfig(
  weight_dtype=torch.int4, weight_granularity=PerGroup(g)))`` on the linears and
  ``quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(g)),
  filter_fn=<embeddings>)`` on both tables (token and position, the scope of ours), then
  ``torch.export`` and ``to_edge_transform_and_lower`` (ExecuTorch's quant fusion turns the
  table's ``dequantize_affine`` into ``embedding_4bit``);
- ``ours``: ``ExecuTorchQuantizer("llm", linear_bits=4, linear_group_size=g,
  embedding_bits=4, embedding_group_size=g)``, prepare, convert, then
  ``quantweave_executorch.to_executorch``.

Quantize time: the anchor's ``quantize_`` calls (on a copy of the float model made before the
timer: ExecuTorch's flow transforms the loaded model in place, the copy is this script's, to keep
the float model) vs our prepare + convert of the exported model (wall, and the CPU time of the
process, printed with the ratios: on a loaded machine it varies less than wall time)
(no calibration: 8da4w's activations are quantized at run time and weights are observed at
convert, so calibrating changes nothing); "to export": from the float model to the exported
program ``to_edge_transform_and_lower`` takes (anchor: ``quantize_`` + ``torch.export``; ours:
``torch.export`` + prepare + convert + ``torch.export``). Lowering, ExecuTorch's in both, is not
timed. Each is measured ``--repeats`` times, interleaved, median reported, after ``--warmup``
interleaved rounds left out of the medians: the anchor's first calls in a process page in
16,000-24,000 fresh pages each (its temporaries), its later ones reuse the heap's pages and take
less than half the time, so without the warm-up the "warm" figure is the anchor's first calls.
Runtime latency: the full forward of a 64-token window on the ExecuTorch runtime, interleaved
rounds, median call; then again with the runtime's thread pool at one thread (on a 2-core
machine the default pool's times swing between two levels). Also:
.pte size (and fp32's), logits SQNR vs the float model and top-1 agreement over 8 prompts, ratios
ours / anchor, the load average.

One-shot quantize time (``--one-shot K``, default 5): a user quantizes a model once per
process, where the in-process repeats above measure warm calls. Each side is timed on its
first quantize in a fresh process (imports done before the timed window on both sides: torchao's
``quantize_`` and configs; our quantizer class and the ``quantized_decomposed`` op library,
which convert otherwise loads on first use), K processes per side, alternating, median reported.
Each of those processes then quantizes the same float model again, the first result kept: the
"second call".

Quantize time at LLM size (``--llm-sizes``, default ``0.35,0.7,1.4``; ``--llm-shots K``
processes per side and size, default 3, 0 to skip): the same one-shot measurement on the models
of ``bench_llm_memory.py`` (vocab 32000, dim 1024, 16 heads, untied head, 2 / 9 / 23 layers:
0.36 / 0.72 / 1.42 GB of fp32 weights), 8da4w and 4-bit tables as above. Each process also times
the exports around the quantize (ours: the float model's before, the converted model's after;
the anchor: its model's after), for the "to export" ratio at that size.

    python benchmarks/bench_8da4w.py [--quick] [--group-size 32] [--iters N] [--repeats N] [--warmup N]
        [--one-shot K] [--llm-sizes 0.35,0.7,1.4] [--llm-shots K] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any

import torch
from bench_executorch_llm import latency  # the same interleaved rounds (this script's directory is on sys.path)

warnings.filterwarnings("ignore")


def quantize_anchor(
    model: torch.nn.Module, group_size: int, *, copy_first: bool = True
) -> tuple[torch.nn.Module, float, float]:
    """ExecuTorch's 8da4w source transform (torchao 0.18) on a copy of ``model`` (``copy_first``)
    or on ``model`` itself, and the seconds (wall, then CPU of this process) of its ``quantize_``
    calls (the copy, made first, is not timed: ExecuTorch's flow transforms the loaded model in
    place)."""
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig

    anchor = copy.deepcopy(model) if copy_first else model
    start, cpu = time.perf_counter(), time.process_time()
    quantize_(
        anchor,
        IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group_size)),
        filter_fn=lambda m, fqn: isinstance(m, torch.nn.Embedding),  # both tables, as ours
    )
    quantize_(
        anchor,
        Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group_size)),
    )
    return anchor, time.perf_counter() - start, time.process_time() - cpu


def quantize_ours(model: torch.nn.Module, window: tuple, group_size: int) -> tuple[Any, float, float]:
    """Ours, and the seconds (wall, then CPU of this process) spent in prepare + convert (the rest
    is torch.export). No calibration: the activations are quantized at run time and the weights
    are observed at convert."""
    return quantize_exported(torch.export.export(model, window).module(), group_size)


def quantize_exported(exported: Any, group_size: int) -> tuple[Any, float, float]:
    """Our prepare + convert of an exported model, and its seconds (wall, then CPU)."""
    import quantweave as qw
    import quantweave_executorch as qe

    start, cpu = time.perf_counter(), time.process_time()
    quantizer = qe.ExecuTorchQuantizer(
        "llm", linear_bits=4, linear_group_size=group_size, embedding_bits=4, embedding_group_size=group_size
    )
    converted = qw.convert_pt2e(qw.prepare_pt2e(exported, quantizer))
    return converted, time.perf_counter() - start, time.process_time() - cpu


def one_shot(side: str, vocab: int, group_size: int, size: str | None = None) -> dict[str, float]:
    """Seconds of ``side``'s first quantize in this (fresh) process, its imports done before
    (``quantize_s``), and of the exports around it (``export_before_s``: ours, the float model's;
    ``export_after_s``: the quantized model's), then of a second quantize of the same float model
    in the same process, the first result kept (``second_quantize_s``; the anchor's on the model
    built again from its seed: its first ``quantize_`` transformed the first one in place).
    ``size``: a ``bench_llm_memory`` model size (``"0.35"``...), else ``tiny_decoder_lm(vocab=vocab)``."""
    from torchao.quantization import quantize_  # noqa: F401  (imported before the window, as ours)
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig  # noqa: F401

    import quantweave.convert
    import quantweave_executorch as qe
    from quantweave.testing.models import lm_prompts, tiny_decoder_lm

    torch.set_num_threads(2)
    qe.ExecuTorchQuantizer  # noqa: B018  (the lazily imported class, loaded before the window)
    quantweave.convert.QUANTIZE_OPS  # noqa: B018  (loads the quantized_decomposed ops convert emits)
    config: dict[str, Any] = {"vocab": vocab}
    seq = None  # the model's own window
    if size is not None:
        from bench_llm_memory import DIM, HEADS, LAYERS, SEQ, VOCAB

        config = {"vocab": VOCAB, "dim": DIM, "layers": LAYERS[size], "heads": HEADS, "max_seq": SEQ}
        seq = 16
        # torch.export's own first-use imports, before either side's window (as bench_llm_memory)
        torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    model = tiny_decoder_lm(**config)
    window = (lm_prompts(model, 1, seq=seq),)
    times: dict[str, float] = {"export_before_s": 0.0}
    if side == "anchor":
        quantized, times["quantize_s"], _ = quantize_anchor(model, group_size, copy_first=False)
    else:
        start = time.perf_counter()
        exported = torch.export.export(model, window).module()
        times["export_before_s"] = time.perf_counter() - start
        quantized, times["quantize_s"], _ = quantize_exported(exported, group_size)
    start = time.perf_counter()
    torch.export.export(quantized, window)
    times["export_after_s"] = time.perf_counter() - start
    if side == "anchor":
        _, times["second_quantize_s"], _ = quantize_anchor(tiny_decoder_lm(**config), group_size, copy_first=False)
    else:
        _, times["second_quantize_s"], _ = quantize_exported(torch.export.export(model, window).module(), group_size)
    return times


def one_shot_runs(processes: int, vocab: int, group_size: int, size: str | None = None) -> dict[str, list[dict]]:
    """``processes`` fresh processes per side, alternating: each side's :func:`one_shot` times."""
    runs: dict[str, list[dict]] = {"anchor": [], "ours": []}
    for k in range(processes):
        for side in ("anchor", "ours") if k % 2 == 0 else ("ours", "anchor"):
            command = [sys.executable, __file__, "--child", side, "--group-size", str(group_size)]
            command += ["--quick"] if vocab != 32000 else []
            command += ["--child-size", size] if size is not None else []
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


_ALL_STEPS = ("export_before_s", "quantize_s", "export_after_s")


def _median(runs: list[dict], *keys: str) -> float:
    return statistics.median(sum(run[key] for key in keys) for run in runs)


def _each(runs: list[dict], scale: float, spec: str) -> str:
    """Every run's quantize time, times ``scale``, formatted with ``spec``."""
    return " ".join(format(run["quantize_s"] * scale, spec) for run in runs)


def latency_one_thread(runners: dict[str, Any], inputs: tuple, iters: int) -> dict | None:
    """:func:`latency` with the ExecuTorch runtime's thread pool at one thread (restored after);
    None where the runtime has no way to set it. On a 2-core VM the default pool (one thread per
    core) makes the per-round times of every program swing between two levels (0.9 and 1.9 ms on
    this model), so the ratio of two programs moves by 0.2x from run to run; with one thread it
    stays within a few percent."""
    try:
        from executorch.extension.pybindings import portable_lib
    except ImportError:
        return None
    reset = getattr(portable_lib, "_unsafe_reset_threadpool", None)
    count = getattr(portable_lib, "_threadpool_get_thread_count", None)
    if reset is None or count is None:
        return None
    before = count()
    reset(1)
    try:
        return latency(runners, inputs, iters)
    finally:
        reset(before)


def lower_anchor(anchor: torch.nn.Module, window: tuple) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(torch.export.export(anchor, window), partitioner=[XnnpackPartitioner()])
    return bytes(edge.to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)).buffer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="vocab 4096 (a smoke run, not the recorded figures)")
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--iters", type=int, default=100, help="timed runtime calls per program")
    parser.add_argument("--repeats", type=int, default=3, help="timed quantize runs per path (interleaved)")
    parser.add_argument("--warmup", type=int, default=5, help="rounds per path before them, not in the medians")
    parser.add_argument("--one-shot", type=int, default=5, help="fresh processes per side for the one-shot time")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--llm-sizes", default="0.35,0.7,1.4", help="bench_llm_memory model sizes (GB of fp32)")
    parser.add_argument("--llm-shots", type=int, default=3, help="fresh processes per side and LLM size (0: none)")
    parser.add_argument("--child", choices=("anchor", "ours"), help=argparse.SUPPRESS)  # one one-shot process
    parser.add_argument("--child-size", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_shot(args.child, 4096 if args.quick else 32000, args.group_size, args.child_size)))
        return

    # the fresh processes first, while this one holds little memory: on the 2-core VM of sessions 9-12,
    # fresh pages cost ~8x more once the processes hold over ~3 GiB together, and a process quantizing
    # the 1.4 GB model took up to 3x longer on both sides, varying from process to process, while its
    # parent held 1-2 GB (this one holds 1.07 GB after the rest: docs/benchmarks.md, session 12)
    vocab = 4096 if args.quick else 32000
    shots = one_shot_runs(args.one_shot, vocab, args.group_size) if args.one_shot > 0 else None
    sizes = [size for size in args.llm_sizes.split(",") if size] if args.llm_shots > 0 and not args.quick else []
    at_size = {size: one_shot_runs(args.llm_shots, 32000, args.group_size, size) for size in sizes}

    import executorch.kernels.quantized  # noqa: F401  (embedding_4bit for the anchor's program)
    from executorch.runtime import Runtime

    import quantweave_executorch as qe
    from quantweave.testing.inspect import sqnr
    from quantweave.testing.models import lm_prompts, tiny_decoder_lm

    torch.set_num_threads(2)
    load_before = os.getloadavg()
    model = tiny_decoder_lm(vocab=vocab)
    prompts = lm_prompts(model, 8)
    window = (prompts[:1],)
    g = args.group_size
    with torch.no_grad():
        reference = torch.cat([model(prompts[i : i + 1]) for i in range(8)])

    # "quantize": the anchor's quantize_ calls vs our prepare + convert; "to export": from the float model to
    # the exported program to_edge_transform_and_lower takes (anchor: quantize_ + torch.export; ours:
    # torch.export + prepare + convert + torch.export, the second export being the one to_executorch does)
    times: dict[str, list[float]] = {"anchor": [], "ours": []}
    cpu_times: dict[str, list[float]] = {"anchor": [], "ours": []}  # CPU of this process: less noisy under load
    to_export: dict[str, list[float]] = {"anchor": [], "ours": []}
    warmup: dict[str, list[float]] = {"anchor": [], "ours": []}  # the warm-up rounds': reported, not in medians
    anchor = converted = None
    for r in range(args.warmup + args.repeats):
        for name in ("anchor", "ours") if r % 2 == 0 else ("ours", "anchor"):
            if name == "anchor":
                anchor, seconds, cpu_seconds = quantize_anchor(model, g)
                start = time.perf_counter() - seconds  # from its quantize_ calls (not the script's copy before them)
                torch.export.export(anchor, window)
            else:
                start = time.perf_counter()
                converted, seconds, cpu_seconds = quantize_ours(model, window, g)
                torch.export.export(converted, window)
            if r < args.warmup:
                warmup[name].append(seconds)
                continue
            times[name].append(seconds)
            cpu_times[name].append(cpu_seconds)
            to_export[name].append(time.perf_counter() - start)
    assert anchor is not None and converted is not None

    buffers = {
        "fp32": qe.to_executorch(model, window).buffer,
        "anchor": lower_anchor(anchor, window),
        "ours": qe.to_executorch(converted, window).buffer,
    }
    programs = {name: Runtime.get().load_program(buf) for name, buf in buffers.items()}  # keep the programs alive
    methods = {name: program.load_method("forward") for name, program in programs.items()}
    runners = {name: (lambda *x, m=method: m.execute(list(x))) for name, method in methods.items()}
    outputs = {name: torch.cat([run(prompts[i : i + 1])[0] for i in range(8)]) for name, run in runners.items()}
    lat = latency(runners, window, args.iters)
    lat_one = latency_one_thread(runners, window, args.iters)
    load_after = os.getloadavg()

    params = sum(p.numel() for p in model.parameters())
    print(
        f"tiny_decoder_lm: vocab {model.tok.num_embeddings}, dim {model.tok.embedding_dim}, {len(model.blocks)} "
        f"layers, {params:,} parameters, untied head; 8da4w group size {g}; forward of a {window[0].shape[1]}-token "
        "window, batch 1"
    )
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")
    results: dict[str, Any] = {
        "parameters": params,
        "group_size": g,
        "load_before": load_before,
        "load_after": load_after,
    }
    header = f"{'program':<8} {'.pte bytes':>12} {'vs fp32':>8} {'forward ms':>11} {'SQNR dB':>8} {'top-1':>6}"
    print(f"{header} {'quantize s':>11} {'to export s':>12}")
    for name, buf in buffers.items():
        out = outputs[name]
        row = {
            "pte_bytes": len(buf),
            "smaller_than_fp32": len(buffers["fp32"]) / len(buf),
            "forward_ms": lat[name] * 1e3,
            "sqnr_vs_float_db": sqnr(reference, out),
            "top1_agreement": (out.argmax(-1) == reference.argmax(-1)).float().mean().item(),
            "quantize_s": statistics.median(times[name]) if name in times else None,
            "quantize_cpu_s": statistics.median(cpu_times[name]) if name in cpu_times else None,
            "to_export_s": statistics.median(to_export[name]) if name in to_export else None,
        }
        results[name] = row
        quantize = "-" if row["quantize_s"] is None else f"{row['quantize_s']:.3f}"
        exported_s = "-" if row["to_export_s"] is None else f"{row['to_export_s']:.3f}"
        print(
            f"{name:<8} {row['pte_bytes']:>12,} {row['smaller_than_fp32']:>7.2f}x {row['forward_ms']:>11.3f} "
            f"{row['sqnr_vs_float_db']:>8.2f} {row['top1_agreement']:>6.3f} {quantize:>11} {exported_s:>12}"
        )
    ours, anchor_row = results["ours"], results["anchor"]
    ratios = {
        "pte_size": ours["pte_bytes"] / anchor_row["pte_bytes"],
        "sqnr_db_difference": ours["sqnr_vs_float_db"] - anchor_row["sqnr_vs_float_db"],
        "latency": ours["forward_ms"] / anchor_row["forward_ms"],
        "quantize_time": ours["quantize_s"] / anchor_row["quantize_s"],
        "quantize_cpu_time": statistics.median(cpu_times["ours"]) / statistics.median(cpu_times["anchor"]),
        "to_export_time": ours["to_export_s"] / anchor_row["to_export_s"],
    }
    if lat_one is not None:
        results["forward_ms_one_runtime_thread"] = {name: value * 1e3 for name, value in lat_one.items()}
        ratios["latency_one_runtime_thread"] = lat_one["ours"] / lat_one["anchor"]
    results["warmup_quantize_s"] = warmup
    if shots is not None:
        results["one_shot"] = shots
        ratios["one_shot_quantize_time"] = _median(shots["ours"], "quantize_s") / _median(shots["anchor"], "quantize_s")
        ratios["one_shot_second_quantize_time"] = _median(shots["ours"], "second_quantize_s") / _median(
            shots["anchor"], "second_quantize_s"
        )
    results["at_llm_size"] = at_size
    results["ours_vs_anchor"] = ratios
    print(
        f"ours / anchor: .pte {ratios['pte_size']:.4f}x, SQNR {ratios['sqnr_db_difference']:+.2f} dB, "
        f"latency {ratios['latency']:.3f}x, quantize time {ratios['quantize_time']:.3f}x "
        f"(CPU {ratios['quantize_cpu_time']:.3f}x; to export {ratios['to_export_time']:.3f}x) "
        f"(goals: .pte >= 6.5x smaller than fp32, SQNR >= -0.5 dB, latency <= 1.1x, quantize <= 0.5x)"
    )
    if lat_one is not None:
        print(
            "latency with the runtime's thread pool at 1 thread (steadier than the default pool on a 2-core machine): "
            + ", ".join(f"{name} {value * 1e3:.3f} ms" for name, value in lat_one.items())
            + f", ours / anchor {ratios['latency_one_runtime_thread']:.3f}x"
        )
    print(
        f"warm-up rounds (not in the medians): anchor {' '.join(f'{x * 1e3:.1f}' for x in warmup['anchor'])} ms; "
        f"ours {' '.join(f'{x * 1e3:.1f}' for x in warmup['ours'])} ms"
    )
    if shots is not None:
        print(
            f"one-shot quantize (first call in a fresh process, imports before it; {args.one_shot} processes per "
            "side): "
            f"anchor {_median(shots['anchor'], 'quantize_s'):.3f} s, "
            f"ours {_median(shots['ours'], 'quantize_s'):.3f} s, "
            f"{ratios['one_shot_quantize_time']:.3f}x (each: anchor "
            f"{_each(shots['anchor'], 1e3, '.1f')} ms; ours "
            f"{_each(shots['ours'], 1e3, '.1f')} ms); the second call in those processes: anchor "
            f"{_median(shots['anchor'], 'second_quantize_s') * 1e3:.1f} ms, ours "
            f"{_median(shots['ours'], 'second_quantize_s') * 1e3:.1f} ms, "
            f"{ratios['one_shot_second_quantize_time']:.3f}x"
        )
    if at_size:
        print(
            f"at LLM size, one-shot ({args.llm_shots} fresh processes per side and size, alternating; medians; "
            f"load average now {os.getloadavg()[0]:.2f}): quantize = anchor quantize_ vs our prepare + convert; "
            "to export = anchor quantize_ + export vs our export + prepare + convert + export; "
            "2nd call = the same quantize again in the same process"
        )
        heads = ("GB fp32", 7), ("anchor s", 9), ("ours s", 7), ("quantize", 9), ("anchor s", 9), ("ours s", 7)
        print(" ".join(f"{head:>{width}}" for head, width in heads) + f" {'to export':>9} {'2nd call':>9}")
        for size, runs in at_size.items():
            quantize = {side: _median(runs[side], "quantize_s") for side in runs}
            exported = {side: _median(runs[side], *_ALL_STEPS) for side in runs}
            ratios[f"llm_{size}_quantize_time"] = quantize["ours"] / quantize["anchor"]
            ratios[f"llm_{size}_to_export_time"] = exported["ours"] / exported["anchor"]
            second = {side: _median(runs[side], "second_quantize_s") for side in runs}
            ratios[f"llm_{size}_second_quantize_time"] = second["ours"] / second["anchor"]
            print(
                f"{size:>7} {quantize['anchor']:>9.3f} {quantize['ours']:>7.3f} "
                f"{ratios[f'llm_{size}_quantize_time']:>8.3f}x {exported['anchor']:>9.3f} {exported['ours']:>7.3f} "
                f"{ratios[f'llm_{size}_to_export_time']:>8.3f}x {ratios[f'llm_{size}_second_quantize_time']:>8.3f}x "
                "  (quantize each: anchor "
                f"{_each(runs['anchor'], 1, '.3f')}; ours "
                f"{_each(runs['ours'], 1, '.3f')})"
            )
    print("figures from a loaded machine are not speed claims: re-measure latency and quantize time on a quiet one")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

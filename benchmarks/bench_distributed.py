"""Distributed calibration (quantweave.distributed): 1 vs 2 processes, and the Histogram distance.

    python benchmarks/bench_distributed.py [--quick] [--batches N] [--skip-distance]

**Timing.** ResNet-18-like (``--width``, ``--image``), HistogramObserver activations and
per-channel weights (the reference quantizer, the observers the x86 plugin uses), ``--batches``
calibration batches of ``--batch-size``. Each configuration is a fresh launch: one process
with 2 intra-op threads, one process with 1 thread, and ``torchrun --nproc-per-node 2``
(gloo, 1 thread each, half the batches each). Calibration wall time runs from a barrier to a
barrier (the slowest rank counts); ``sync_observers`` is timed on its own, and so is the
exact variant (``range_pass`` + calibration + sync). "CPU s/rank" is the CPU time of the
busiest rank while calibrating (all its threads): the work split, which load on the machine
does not change. Best of ``--repeat`` within a launch and of ``--rounds`` launches, taken in
rotating order.

**Distance.** For ResNet-18-like, MobileNetV2-like and the encoder block: the qparams after
``sync_observers`` on 2 and 4 processes against one process calibrating the union in order,
as the clipping range's distance in bins of the union histogram (2048 bins), the relative
scale and the zero point; beside it, how far one process moves by itself when the batch
order changes (reversed, two shuffles). SQNR against float on a held-out batch for one
process, the merged model and the range-pass model.

Run on an otherwise idle machine; the script prints ``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import quantweave as qw
import quantweave.distributed as qwd
from quantweave.observers import HistogramObserver
from quantweave.testing.inspect import sqnr
from quantweave.testing.models import (
    calibration_batches,
    encoder_block,
    example_inputs,
    mobilenet_v2_like,
    resnet18_like,
)
from quantweave.testing.reference import make_reference_quantizer

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]


# -- worker side (one rank) --------------------------------------------------------------------


def build(name: str, width: int) -> torch.nn.Module:
    if name == "resnet":
        return resnet18_like(width=width, num_classes=10)
    if name == "mobilenet_v2":
        return mobilenet_v2_like()
    return encoder_block()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def slowest(value: float) -> float:
    """The largest ``value`` over the ranks."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def calibrate(prepared: torch.fx.GraphModule, batches: list[Any]) -> None:
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)


def histogram_result(prepared: torch.fx.GraphModule) -> dict[str, list[float]]:
    """Per HistogramObserver: clipping range in bins of its histogram, scale, zero point."""
    out = {}
    for name, module in prepared.named_children():
        if isinstance(module, HistogramObserver) and qw.observers.is_calibrated(module):
            lo, hi = module.search_min_max()
            width = float(module.max_val - module.min_val) / module.bins
            scale, zero_point = module.calculate_qparams()
            out[name] = [
                (float(lo) - float(module.min_val)) / width,
                (float(hi) - float(module.min_val)) / width,
                float(scale),
                float(zero_point),
            ]
    return out


def worker_timing(args: argparse.Namespace) -> dict[str, Any]:
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    model = build("resnet", args.width)
    exported = torch.export.export(model, example_inputs(model, batch=args.batch_size, image=args.image)).module()
    batches = calibration_batches(model, args.batches, batch=args.batch_size, image=args.image)[rank::world]
    quantizer = make_reference_quantizer(histogram=True)
    best: dict[str, float] = {}
    summary = None
    for _ in range(args.repeat):
        for variant in ("one_pass", "range_pass"):
            prepared = qw.prepare_pt2e(exported, quantizer)
            barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            if variant == "range_pass":
                with qwd.range_pass(prepared):
                    calibrate(prepared, batches)
            calibrate(prepared, batches)
            cpu = slowest(time.process_time() - cpu_start)  # CPU seconds of the busiest rank
            barrier()
            calibrated = time.perf_counter()
            summary = qwd.sync_observers(prepared)
            done = time.perf_counter()
            for key, value in (
                (f"{variant}_calibrate", calibrated - start),
                (f"{variant}_cpu", cpu),
                (f"{variant}_sync", summary.seconds),
                (f"{variant}_total", done - start),
            ):
                best[key] = min(best.get(key, float("inf")), value)
    assert summary is not None
    return {
        **best,
        "world": world,
        "threads": torch.get_num_threads(),
        "observers": sum(summary.merged.values()),
        "merged": summary.merged,
        "payload_bytes": summary.payload_bytes,
    }


def worker_distance(args: argparse.Namespace) -> dict[str, Any]:
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    model = build(args.model, args.width)
    example = example_inputs(model, batch=args.batch_size, image=32)
    exported = torch.export.export(model, example).module()
    batches = calibration_batches(model, args.batches, batch=args.batch_size, image=32)
    held_out = calibration_batches(model, args.batches + 1, batch=args.batch_size, image=32)[-1]
    quantizer = make_reference_quantizer(histogram=True)
    with torch.no_grad():
        expected = model(*held_out)

    def run(order: list[Any], two_pass: bool = False) -> tuple[torch.fx.GraphModule, Any]:
        prepared = qw.prepare_pt2e(exported, quantizer)
        if two_pass:
            with qwd.range_pass(prepared):
                calibrate(prepared, order)
        calibrate(prepared, order)
        return prepared, qwd.sync_observers(prepared)

    def quality(prepared: torch.fx.GraphModule) -> float:
        with torch.no_grad():
            return sqnr(expected, qw.convert_pt2e(prepared)(*held_out))

    out: dict[str, Any] = {}
    if world == 1:
        orders = {"natural": batches, "reversed": batches[::-1]}
        for seed in (0, 1):
            shuffled = batches[:]
            random.Random(seed).shuffle(shuffled)
            orders[f"shuffle{seed}"] = shuffled
        for name, order in orders.items():
            prepared, _ = run(order)
            out[name] = histogram_result(prepared)
            if name == "natural":
                out["sqnr"] = quality(prepared)
        prepared, _ = run(batches, two_pass=True)
        out["range_pass"] = histogram_result(prepared)
        out["range_pass_sqnr"] = quality(prepared)
        return out
    prepared, summary = run(batches[rank::world])
    out["merged"] = histogram_result(prepared)
    out["rebinned"] = len(summary.rebinned)
    out["sqnr"] = quality(prepared)
    prepared, summary = run(batches[rank::world], two_pass=True)
    out["range_pass"] = histogram_result(prepared)
    out["range_pass_exact"] = summary.exact
    out["range_pass_sqnr"] = quality(prepared)
    return out


def worker(args: argparse.Namespace) -> None:
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    torch.set_num_threads(args.threads)
    result = worker_timing(args) if args.task == "timing" else worker_distance(args)
    if not dist.is_initialized() or dist.get_rank() == 0:
        Path(args.json).write_text(json.dumps(result))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# -- parent side ---------------------------------------------------------------------------------


def launch(procs: int, threads: int, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        script = [str(Path(__file__).resolve()), "--worker", "--threads", str(threads), "--json", str(out), *extra]
        if procs == 1:
            command = [sys.executable, *script]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"]
            command += script
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def distance(a: dict[str, list[float]], b: dict[str, list[float]]) -> tuple[float, float, int, int]:
    """(max clip distance in bins, max relative scale difference, max |zero point
    difference|, observers whose qparams differ) over the observers of a and b."""
    assert a.keys() == b.keys() and a
    bins = scale = 0.0
    zero_point = differ = 0
    for name in a:
        (alo, ahi, ascale, azp), (blo, bhi, bscale, bzp) = a[name], b[name]
        bins = max(bins, abs(alo - blo), abs(ahi - bhi))
        scale = max(scale, abs(ascale / bscale - 1))
        zero_point = max(zero_point, int(abs(azp - bzp)))
        differ += (ascale, azp) != (bscale, bzp)
    return bins, scale, zero_point, differ


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "uptime unavailable"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--task", default="timing", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="resnet", help=argparse.SUPPRESS)
    parser.add_argument("--json", default="", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--distance-batches", type=int, default=32)
    parser.add_argument("--distance-batch-size", type=int, default=2)
    parser.add_argument("--skip-distance", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.batches, args.batch_size, args.image, args.width, args.repeat, args.rounds = 8, 2, 32, 8, 1, 1
        args.distance_batches, args.distance_batch_size = 8, 2
    print(f"load before: {uptime()}")
    common = ["--batches", str(args.batches), "--batch-size", str(args.batch_size), "--image", str(args.image)]
    common += ["--width", str(args.width), "--repeat", str(args.repeat)]
    if not args.skip_timing:
        print(
            f"\nTiming: ResNet-18-like w{args.width} {args.image}px, {args.batches} batches of {args.batch_size}, "
            f"HistogramObserver activations + per-channel weights, best of {args.repeat} x {args.rounds} rounds"
        )
        header = f"{'configuration':<24} {'calibrate s':>11} {'CPU s/rank':>10} {'sync ms':>8} {'total s':>8}"
        header += f" | {'range pass: calib+sync s':>24}"
        print(header)
        print("-" * len(header))
        configs = (("1 process x 2 threads", 1, 2), ("1 process x 1 thread", 1, 1), ("2 processes x 1 thread", 2, 1))
        rows: dict[str, dict[str, Any]] = {}
        for round_ in range(args.rounds):  # rotating order, so that load changes hit every configuration
            for label, procs, threads in configs[round_ % 3 :] + configs[: round_ % 3]:
                r = launch(procs, threads, ["--task", "timing", *common])
                best = rows.setdefault(label, r)
                for key, value in r.items():
                    if key.endswith(("_calibrate", "_cpu", "_sync", "_total")):
                        best[key] = min(best[key], value)
        for label, _, _ in configs:
            r = rows[label]
            print(
                f"{label:<24} {r['one_pass_calibrate']:>11.3f} {r['one_pass_cpu']:>10.3f} "
                f"{r['one_pass_sync'] * 1e3:>8.1f} {r['one_pass_total']:>8.3f} | {r['range_pass_total']:>24.3f}"
            )
        two = rows["2 processes x 1 thread"]
        for label in ("1 process x 2 threads", "1 process x 1 thread"):
            print(f"speed-up of 2 processes over {label}: {rows[label]['one_pass_total'] / two['one_pass_total']:.2f}x")
        print(
            f"observers synchronized: {two['observers']} ({two['merged']}); "
            f"payload per rank {two['payload_bytes'] / 1024:.0f} KiB"
        )

    if not args.skip_distance:
        print(
            f"\nHistogram distance to one process on the union ({args.distance_batches} batches of "
            f"{args.distance_batch_size}, interleaved shards): clip = max distance of either end of the clipping "
            "range in bins of 2048; scale = max relative difference; zp = max |zero point difference|"
        )
        header = f"{'model':<13} {'compared with one process in order':<36} {'clip bins':>9} {'scale':>7}"
        header += f" {'zp':>3} {'differ':>7}"
        print(header)
        print("-" * len(header))
        sqnrs = []
        for model in ("resnet", "mobilenet_v2", "encoder"):
            extra = ["--task", "distance", "--model", model, "--batches", str(args.distance_batches)]
            extra += ["--batch-size", str(args.distance_batch_size), "--width", "16"]
            single = launch(1, 1, extra)
            natural = single["natural"]
            lines = []
            for order in ("reversed", "shuffle0", "shuffle1"):
                lines.append((f"one process, {order} order", distance(single[order], natural)))
            lines.append(("one process, range pass", distance(single["range_pass"], natural)))
            for world in (2, 4):
                multi = launch(world, 1, extra)
                lines.append((f"sync_observers, {world} processes", distance(multi["merged"], natural)))
                exact = multi["range_pass"] == single["range_pass"] and multi["range_pass_exact"]
                lines.append(
                    (f"range pass, {world} processes (exact: {exact})", distance(multi["range_pass"], natural))
                )
                sqnrs.append((model, world, single["sqnr"], multi["sqnr"], single["range_pass_sqnr"]))
            for label, (bins, scale, zp, differ) in lines:
                print(f"{model:<13} {label:<36} {bins:>9.0f} {scale:>7.2%} {zp:>3} {differ:>3}/{len(natural)}")
        print("\nSQNR against float on a held-out batch (dB): one process | sync_observers | range pass")
        for model, world, one, merged, ranged in sqnrs:
            print(f"{model:<13} {world} processes   {one:6.2f} | {merged:6.2f} | {ranged:6.2f}")
    print(f"\nload after: {uptime()}")


if __name__ == "__main__":
    main()

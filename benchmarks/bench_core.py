"""Core PT2E flow: quantweave vs torchao on the same models and the same annotation logic.

For ResNet-18-like CNNs at 1x, 4x and 16x depth (blocks per stage repeated) and the
encoder block (d512, 8 heads, ff 2048, seq 128), one run times, for each flow:
export, annotate+prepare, calibration and convert (best of ``--repeat``; every repetition
on a fresh export, since torchao's prepare mutates its input), and prints the ratios
quantweave/torchao, time per 1000 graph nodes (linearity), SQNR vs float, and whether the
two converted models give identical outputs. Annotation is the reference quantizer
(``quantweave.testing.reference``) written once against the PT2E API names, run with
quantweave's names and with torchao's; activations use HistogramObserver (``--minmax``
for MinMaxObserver).

    python benchmarks/bench_core.py [--quick] [--repeat N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import quantweave as qw
from quantweave.testing import models
from quantweave.testing.inspect import sqnr
from quantweave.testing.reference import make_reference_quantizer, quantweave_api, torchao_api

warnings.filterwarnings("ignore")


def torchao_flow() -> tuple[Any, Callable[..., Any], Callable[..., Any]]:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    return torchao_api(), prepare_pt2e, convert_pt2e


def measure(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    calibration: list[tuple[torch.Tensor, ...]],
    held_out: tuple[torch.Tensor, ...],
    flow: tuple[Any, Callable[..., Any], Callable[..., Any]],
    histogram: bool,
    repeat: int,
) -> dict[str, Any]:
    api, prepare, convert = flow
    best: dict[str, float] = {}
    converted = None
    nodes = 0
    for _ in range(repeat):
        start = time.perf_counter()
        exported = torch.export.export(model, inputs).module()
        t_export = time.perf_counter() - start
        nodes = len(exported.graph.nodes)
        quantizer = make_reference_quantizer(api, histogram=histogram)
        start = time.perf_counter()
        prepared = prepare(exported, quantizer)
        t_prepare = time.perf_counter() - start
        start = time.perf_counter()
        with torch.no_grad():
            for batch in calibration:
                prepared(*batch)
        t_calibrate = time.perf_counter() - start
        start = time.perf_counter()
        converted = convert(prepared)
        t_convert = time.perf_counter() - start
        for key, value in (
            ("export", t_export),
            ("prepare", t_prepare),
            ("calibrate", t_calibrate),
            ("convert", t_convert),
        ):
            best[key] = min(best.get(key, float("inf")), value)
    assert converted is not None
    with torch.no_grad():
        out = converted(*held_out)
        ref = model(*held_out)
    return {**best, "nodes": nodes, "sqnr_db": sqnr(ref, out), "output": out}


def cases(quick: bool) -> list[tuple[str, Callable[[], torch.nn.Module], Callable[[int], tuple[torch.Tensor, ...]]]]:
    def image(size: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
        return lambda seed: (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed)),)

    def tokens(seed: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(1, 128, 512, generator=torch.Generator().manual_seed(seed)),)

    if quick:
        return [
            ("resnet x1 (w16, 32px)", lambda: models.resnet18_like(width=16, num_classes=10), image(32)),
            (
                "resnet x4 (w16, 32px)",
                lambda: models.resnet18_like(width=16, num_classes=10, depth_multiplier=4),
                image(32),
            ),
        ]
    return [
        ("resnet18 x1 (w64, 224px)", lambda: models.resnet18_like(), image(224)),
        ("resnet x1 (w16, 64px)", lambda: models.resnet18_like(width=16, num_classes=100), image(64)),
        (
            "resnet x4 (w16, 64px)",
            lambda: models.resnet18_like(width=16, num_classes=100, depth_multiplier=4),
            image(64),
        ),
        (
            "resnet x16 (w16, 64px)",
            lambda: models.resnet18_like(width=16, num_classes=100, depth_multiplier=16),
            image(64),
        ),
        ("encoder d512 seq128", lambda: models.encoder_block(d_model=512, heads=8, ff=2048), tokens),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, one repetition (< 1 minute)")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions per flow (best time is kept)")
    parser.add_argument("--calibration", type=int, default=None, help="calibration batches")
    parser.add_argument("--minmax", action="store_true", help="MinMaxObserver activations instead of Histogram")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    repeat = args.repeat or (1 if args.quick else 3)
    n_calib = args.calibration or (2 if args.quick else 10)
    flows = {"quantweave": (quantweave_api(), qw.prepare_pt2e, qw.convert_pt2e), "torchao": torchao_flow()}
    rows = []
    header = (
        f"{'model':<26} {'nodes':>6} | {'flow':<10} {'export':>8} {'prepare':>8} {'calib':>8} {'convert':>8} "
        f"{'p+c ms/1k nodes':>15} {'SQNR dB':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, factory, make in cases(args.quick):
        model = factory()
        inputs, held_out = make(0), make(999)
        calibration = [make(100 + i) for i in range(n_calib)]
        results = {
            flow: measure(model, inputs, calibration, held_out, f, not args.minmax, repeat) for flow, f in flows.items()
        }
        ours, theirs = results["quantweave"], results["torchao"]
        for flow, r in results.items():
            per_k = (r["prepare"] + r["convert"]) * 1e3 / (r["nodes"] / 1000)
            print(
                f"{name if flow == 'quantweave' else '':<26} {r['nodes'] if flow == 'quantweave' else '':>6} | "
                f"{flow:<10} {r['export']:8.3f} {r['prepare']:8.3f} {r['calibrate']:8.3f} {r['convert']:8.3f} "
                f"{per_k:15.1f} {r['sqnr_db']:8.2f}"
            )
        ratio = {k: ours[k] / theirs[k] for k in ("prepare", "convert")}
        ratio["prepare+convert"] = (ours["prepare"] + ours["convert"]) / (theirs["prepare"] + theirs["convert"])
        diff = float((ours["output"] - theirs["output"]).abs().max())
        print(
            f"{'':<26} {'':>6} | ratio qw/ao: prepare {ratio['prepare']:.2f}x, convert {ratio['convert']:.2f}x, "
            f"prepare+convert {ratio['prepare+convert']:.2f}x; outputs max abs diff {diff:g}"
        )
        rows.append(
            {
                "model": name,
                "nodes": ours["nodes"],
                **{
                    f"{flow}_{k}": r[k]
                    for flow, r in results.items()
                    for k in ("export", "prepare", "calibrate", "convert", "sqnr_db")
                },
                "ratio": ratio,
                "max_abs_diff": diff,
            }
        )
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

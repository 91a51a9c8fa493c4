"""Calibration cost: prepared-model forward time over float forward time.

For the ResNet-18-like CNN (w64, 224 px, batch 1) and the encoder block (d512, 8 heads,
ff 2048, seq 128, batch 1), annotated by the reference quantizer
(``quantweave.testing.reference``: uint8 per-tensor activations, int8 per-channel
symmetric weights) with MinMaxObserver or HistogramObserver activations, it times
calibration (the prepared model's forward over the batches) against the exported float
model's forward over the same batches. The two are interleaved batch by batch (the order
alternating) in one process, so machine load weighs on both alike. Each repetition uses a
fresh ``prepare_pt2e`` (histogram ranges grow over the first batches, as in a real
calibration); the reported ratio is the median over repetitions.

Observer sets measured on the same models in the same run: torch's
(``torch.ao.quantization.observer``: "before") and quantweave's default ones
(``quantweave.observers``: "after"; ``FastHistogramObserver``, the former opt-in class, is
now another name of the default ``HistogramObserver``); the converted models' qparams and
outputs must be identical across them (checked, printed). ``--histogram-only`` measures the
histogram-activation rows only.

``--validation`` measures instead what ``quantweave.calibrate``'s transactional batches cost
(issue #20: each batch checked against the exported program's inputs, the observers' state
kept to roll a failed batch back, non-finite values looked for): each batch run as
``qw.calibrate`` runs it against the plain ``prepared(*batch)`` calibrate was before, on two
fresh ``prepare_pt2e`` of the same model per repetition, interleaved batch by batch (the
order alternating), with the checked side's set-up counted; the overhead is the median of the
per-repetition ratios minus 1 (target: at most 3 % of a calibration pass). The observers'
states must come out identical.

    python benchmarks/bench_calibration.py [--quick] [--repeat N] [--batches N] [--threads N] [--histogram-only]
        [--validation] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

import quantweave as qw
from quantweave.testing import models
from quantweave.testing.inspect import qdq_summary
from quantweave.testing.reference import make_reference_quantizer, quantweave_api

warnings.filterwarnings("ignore")

OBSERVERS = ("MinMaxObserver", "HistogramObserver", "PerChannelMinMaxObserver")


def observer_sets() -> dict[str, Any]:
    """'before': the reference quantizer's API with torch's observer classes; 'after':
    quantweave's (the default ones)."""
    import torch.ao.quantization.observer as torch_observers

    after = quantweave_api()
    before = types.SimpleNamespace(**vars(after))
    for name in OBSERVERS:
        setattr(before, name, getattr(torch_observers, name))
    return {"before (torch observers)": before, "after (quantweave default)": after}


def cases(quick: bool) -> list[tuple[str, Callable[[], torch.nn.Module], Callable[[int], tuple[torch.Tensor, ...]]]]:
    def image(size: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
        return lambda seed: (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed)),)

    def tokens(seq: int, d: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
        return lambda seed: (torch.randn(1, seq, d, generator=torch.Generator().manual_seed(seed)),)

    if quick:
        return [
            ("resnet18 (w16, 64px)", lambda: models.resnet18_like(width=16, num_classes=100), image(64)),
            ("encoder d128 seq64", lambda: models.encoder_block(d_model=128, heads=4, ff=512), tokens(64, 128)),
        ]
    return [
        ("resnet18 (w64, 224px)", lambda: models.resnet18_like(), image(224)),
        ("encoder d512 seq128", lambda: models.encoder_block(d_model=512, heads=8, ff=2048), tokens(128, 512)),
    ]


def measure(
    exported: torch.fx.GraphModule, api: Any, histogram: bool, batches: list[tuple[torch.Tensor, ...]], repeat: int
) -> tuple[float, float, float, torch.fx.GraphModule]:
    """(median ratio, float ms per batch, calibration ms per batch, last prepared model)."""
    ratios, float_ms, calib_ms = [], [], []
    prepared = None
    with torch.no_grad():
        exported(*batches[0])  # warm-up
        for r in range(repeat):
            prepared = qw.prepare_pt2e(exported, make_reference_quantizer(api, histogram=histogram))
            t_float = t_calib = 0.0
            for i, batch in enumerate(batches):
                order = (0, 1) if (i + r) % 2 == 0 else (1, 0)
                for which in order:
                    model = exported if which == 0 else prepared
                    start = time.perf_counter()
                    model(*batch)
                    elapsed = time.perf_counter() - start
                    if which == 0:
                        t_float += elapsed
                    else:
                        t_calib += elapsed
            ratios.append(t_calib / t_float)
            float_ms.append(t_float * 1e3 / len(batches))
            calib_ms.append(t_calib * 1e3 / len(batches))
    assert prepared is not None
    return statistics.median(ratios), statistics.median(float_ms), statistics.median(calib_ms), prepared


def plain_loop(prepared: torch.fx.GraphModule, batches: list[tuple[torch.Tensor, ...]]) -> None:
    """What ``quantweave.calibrate`` did per batch before issue #20 (no checks, no rollback)."""
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)


def measure_validation(
    exported: torch.fx.GraphModule, histogram: bool, batches: list[tuple[torch.Tensor, ...]], repeat: int
) -> tuple[float, float, float, bool]:
    """(median overhead ratio, plain ms per pass, calibrate ms per pass, states identical).

    Per repetition, two fresh ``prepare_pt2e`` of the model: one runs each batch the way
    ``qw.calibrate`` does (``BatchGuard.run``: check, run, look for non-finite values, keep
    the state), the other the plain loop; the two are interleaved batch by batch, the order
    alternating, so machine load weighs on both alike. The guard's set-up (reading the
    inputs and observers, the first copy of their state) counts on the checked side; listing
    the observers and the result computed at the end (which calibrate did before too) on
    both."""
    from quantweave._modules.batch_guard import BatchGuard
    from quantweave.calibration import _observers, _saw_data

    api = quantweave_api()
    ratios, plain_ms, checked_ms = [], [], []
    identical = True
    with torch.no_grad():
        exported(*batches[0])  # warm-up
        for r in range(repeat):
            checked, plain = (
                qw.prepare_pt2e(exported, make_reference_quantizer(api, histogram=h)) for h in [histogram] * 2
            )
            start = time.perf_counter()
            observers = _observers(checked)
            guard = BatchGuard(checked, observers, skip_non_finite=False)
            t_checked = time.perf_counter() - start
            start = time.perf_counter()
            plain_observers = _observers(plain)  # the old calibrate listed them too (for its result)
            t_plain = time.perf_counter() - start
            for i, batch in enumerate(batches):
                for which in (0, 1) if (i + r) % 2 == 0 else (1, 0):
                    start = time.perf_counter()
                    if which == 0:
                        plain(*batch)
                        t_plain += time.perf_counter() - start
                    else:
                        guard.run(batch, i)
                        t_checked += time.perf_counter() - start
            for which in (0, 1) if r % 2 == 0 else (1, 0):  # the result both compute at the end
                start = time.perf_counter()
                sum(1 for m in (plain_observers if which == 0 else observers).values() if _saw_data(m))
                if which == 0:
                    t_plain += time.perf_counter() - start
                else:
                    t_checked += time.perf_counter() - start
            ratios.append(t_checked / t_plain)
            plain_ms.append(t_plain * 1e3)
            checked_ms.append(t_checked * 1e3)
            a, b = plain.state_dict(), checked.state_dict()
            identical = identical and all(torch.equal(a[k], b[k]) for k in a)
    return statistics.median(ratios), statistics.median(plain_ms), statistics.median(checked_ms), identical


def main_validation(args: argparse.Namespace) -> int:
    repeat = args.repeat or (5 if args.quick else 7)
    n_batches = args.batches or 10
    load_before = os.getloadavg()
    print(f"load average at start: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    print(f"threads: {args.threads}, calibration batches: {n_batches}, repetitions (median): {repeat}")
    header = f"{'model':<24} {'activations':<10} | {'plain ms':>9} {'calibrate ms':>12} {'overhead':>9} identical"
    print(header)
    print("-" * len(header))
    results = []
    for name, factory, make in cases(args.quick):
        exported = torch.export.export(factory(), make(0)).module()
        batches = [make(100 + i) for i in range(n_batches)]
        for histogram in (True,) if args.histogram_only else (False, True):
            kind = "histogram" if histogram else "minmax"
            ratio, p_ms, c_ms, same = measure_validation(exported, histogram, batches, repeat)
            print(f"{name:<24} {kind:<10} | {p_ms:9.2f} {c_ms:12.2f} {100 * (ratio - 1):8.2f}% {same}", flush=True)
            results.append(
                {"model": name, "activations": kind, "plain_ms": p_ms, "calibrate_ms": c_ms, "ratio": ratio}
                | {"identical": same}
            )
    load_after = os.getloadavg()
    print(f"load average at end: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"results": results, "load": [load_before, load_after]}, f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models (< 1 minute)")
    parser.add_argument("--repeat", type=int, default=None, help="fresh calibrations per configuration (median)")
    parser.add_argument("--batches", type=int, default=None, help="calibration batches")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--histogram-only", action="store_true", help="only the histogram-activation rows")
    parser.add_argument("--validation", action="store_true", help="qw.calibrate's checks and rollback vs a plain loop")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    if args.validation:
        return main_validation(args)
    repeat = args.repeat or (2 if args.quick else 5)
    n_batches = args.batches or 10
    sets = observer_sets()
    load_before = os.getloadavg()
    print(f"load average at start: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    header = f"{'model':<24} {'activations':<10} | {'observers':<29} {'float ms':>9} {'calib ms':>9} {'ratio':>6}"
    print(f"threads: {args.threads}, calibration batches: {n_batches}, repetitions (median): {repeat}")
    print(header)
    print("-" * len(header))
    results = []
    for name, factory, make in cases(args.quick):
        model = factory()
        exported = torch.export.export(model, make(0)).module()
        batches = [make(100 + i) for i in range(n_batches)]
        for histogram in (True,) if args.histogram_only else (False, True):
            kind = "histogram" if histogram else "minmax"
            converted = {}
            for label, api in sets.items():
                ratio, f_ms, c_ms, prepared = measure(exported, api, histogram, batches, repeat)
                converted[label] = qw.convert_pt2e(prepared)
                print(f"{name:<24} {kind:<10} | {label:<29} {f_ms:9.2f} {c_ms:9.2f} {ratio:5.2f}x", flush=True)
                results.append(
                    {"model": name, "activations": kind, "observers": label, "float_ms": f_ms, "calib_ms": c_ms}
                    | {"ratio": ratio}
                )
            before, *others = converted.values()
            same_qparams = all(qdq_summary(before) == qdq_summary(other) for other in others)
            with torch.no_grad():
                same_out = all(torch.equal(before(*batches[0]), other(*batches[0])) for other in others)
            print(f"{'':<24} {'':<10} | qparams identical: {same_qparams}; outputs identical: {same_out}")
            for row in results[-len(converted) :]:
                row["identical"] = same_qparams and same_out
    load_after = os.getloadavg()
    print(f"load average at end: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"results": results, "load": [load_before, load_after]}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

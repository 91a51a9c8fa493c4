"""quantweave quickstart: quantize the bundled model end to end with quantweave-x86.

On a fresh machine with ``torch==2.13.0``, ``quantweave`` and ``quantweave-x86`` installed:

1. builds the bundled ResNet-18-like model (deterministic weights, eval mode) and its
   bundled calibration data (deterministic synthetic images);
2. exports it with default ``torch.export``;
3. finds the ``x86`` quantizer through the plugin registry, runs ``prepare_pt2e``,
   calibrates, ``convert_pt2e``, and prints the annotation report summary;
4. lowers the int8 model with ``quantweave_x86.lower`` and the float model with the same
   inductor settings, and prints fp32 vs int8 latency, SQNR against float, and the size
   of the saved fp32 and int8 ``torch.export`` programs (checking the int8 one reloads with
   identical outputs).

Options: ``--image N`` (input size, default 224), ``--calibration N`` (batches, default 8),
``--iters N`` (timed runs, default 20), ``--out DIR`` (where to save the programs).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import quantweave as qw
from quantweave.testing.inspect import sqnr
from quantweave.testing.models import calibration_batches, example_inputs, resnet18_like

warnings.filterwarnings("ignore", message=".*LeafSpec.*")


def latency(fn: Callable[..., Any], args: tuple[Any, ...], iters: int) -> float:
    with torch.no_grad():
        for _ in range(3):
            fn(*args)
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            fn(*args)
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def compile_float(model: torch.nn.Module, args: tuple[Any, ...]) -> Callable[..., Any]:
    import torch._inductor.config as inductor_config

    compiled = torch.compile(torch.export.export(model, args).module())

    def run(*a: Any) -> Any:
        with torch.no_grad(), inductor_config.patch(freezing=True):
            return compiled(*a)

    run(*args)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--calibration", type=int, default=8)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import quantweave_x86

    model = resnet18_like()
    (x,) = example_inputs(model, image=args.image)
    timings: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., Any], *a: Any) -> Any:
        start = time.perf_counter()
        result = fn(*a)
        timings[name] = time.perf_counter() - start
        return result

    quantizer = qw.get_quantizer("x86")
    exported = timed("export", lambda: torch.export.export(model, (x,)).module())
    prepared = timed("prepare_pt2e", qw.prepare_pt2e, exported, quantizer)
    batches = calibration_batches(model, args.calibration, image=args.image)  # batch 1, as exported
    timed("calibrate", lambda: [prepared(*b) for b in batches])
    converted = timed("convert_pt2e", qw.convert_pt2e, prepared)
    report = qw.annotation_report(prepared, quantizer)
    int8 = timed("lower (int8)", quantweave_x86.lower, converted, (x,))
    fp32 = timed("compile (fp32)", compile_float, model, (x,))

    with torch.no_grad():
        reference = model(x)
    fp32_latency, int8_latency = latency(fp32, (x,), args.iters), latency(int8, (x,), args.iters)

    out_dir = args.out or Path(tempfile.mkdtemp(prefix="quantweave-quickstart-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    fp32_path, int8_path = out_dir / "resnet18_like_fp32.pt2", out_dir / "resnet18_like_int8.pt2"
    torch.export.save(torch.export.export(model, (x,)), fp32_path)
    torch.export.save(torch.export.export(converted, (x,)), int8_path)
    round_trip = torch.equal(torch.export.load(int8_path).module()(x), converted(x))

    shape = f"1x3x{args.image}x{args.image}"
    print(f"model            ResNet-18-like, input {shape}, {args.calibration} calibration batches")
    print(f"plugins          {', '.join(f'{p.name} ({p.status})' for p in qw.plugins())}")
    for name, seconds in timings.items():
        print(f"{name:<16} {seconds:8.3f} s")
    print(f"annotated        {report.quantized} compute nodes quantized, {report.float} float")
    print(
        f"latency (b1)     fp32 {fp32_latency * 1e3:.2f} ms, int8 {int8_latency * 1e3:.2f} ms "
        f"({fp32_latency / int8_latency:.2f}x faster)"
    )
    print(
        f"SQNR vs float    {sqnr(reference, int8(x)):.2f} dB (compiled int8), "
        f"{sqnr(reference, converted(x)):.2f} dB (reference q/dq)"
    )
    fp32_size, int8_size = fp32_path.stat().st_size, int8_path.stat().st_size
    print(
        f"saved size       fp32 {fp32_size / 1e6:.1f} MB, int8 {int8_size / 1e6:.1f} MB "
        f"({int8_size / fp32_size:.3f}x)  -> {out_dir}"
    )
    print(f"save/load        {'identical outputs' if round_trip else 'OUTPUTS DIFFER'}")
    return 0 if round_trip else 1


if __name__ == "__main__":
    raise SystemExit(main())

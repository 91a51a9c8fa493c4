"""quantweave quickstart: quantize the bundled model end to end with quantweave-x86.

On a fresh machine with ``torch==2.13.0``, ``quantweave`` and ``quantweave-x86`` installed:

1. builds the bundled ResNet-18-like model (deterministic weights, eval mode) and its
   bundled calibration data (deterministic synthetic images);
2. exports it with default ``torch.export``;
3. finds the ``x86`` quantizer through the plugin registry, runs ``prepare_pt2e``,
   ``quantweave.calibrate`` (a progress bar on a terminal), ``convert_pt2e``, and prints
   the annotation report summary (and why nodes stayed float);
4. saves the int8 model with ``quantweave.save`` and reloads it with ``quantweave.load``
   (identical outputs), and compares the saved fp32 and int8 sizes;
5. lowers the int8 model with ``quantweave_x86.lower`` and the float model with the same
   inductor settings, and prints fp32 vs int8 latency and SQNR against float, with the
   CPU's int8 instructions (AMX, VNNI or only AVX2) and what they mean for the speed-up.

Nothing is left on disk unless ``--out DIR`` is given (the programs are saved there; the
compiler cache of ``torch.compile`` is torch's own, under ``TORCHINDUCTOR_CACHE_DIR``).
Options: ``--image N`` (input size, default 224), ``--calibration N`` (batches, default 8),
``--iters N`` (timed runs, default 20), ``--out DIR``, ``--tiny`` (a small model on 32x32
inputs, 2 calibration batches, 3 timed runs: the whole flow in seconds, as CI runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
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


#: x86 CPU flags that decide how fast int8 conv / linear kernels (oneDNN) can be, best first
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512f", "avx2")


def cpu_flags() -> set[str]:
    """The CPU's feature flags, from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def int8_speed_note(flags: set[str]) -> tuple[str, str]:
    """(the int8 instructions found, what they mean for int8 speed)."""
    found = [f for f in INT8_FLAGS if f in flags]
    listed = ", ".join(found) or "none of " + ", ".join(INT8_FLAGS) + " (or flags unreadable)"
    if "amx_int8" in flags:
        meaning = "AMX: int8 matrix tiles; int8 conv/linear can be several times faster than fp32"
    elif {"avx512_vnni", "avx_vnni"} & flags:
        meaning = (
            "VNNI: one instruction per int8 multiply-accumulate; int8 conv/linear beat fp32 when compute-bound "
            "(large inputs, batches); at batch 1 on a small model the gain is small (overheads, memory)"
        )
    elif "avx2" in flags:
        meaning = (
            "AVX2 without VNNI: int8 dot products take several instructions, so int8 is often no faster than fp32 "
            "(the gain is 4x smaller weights); use X86InductorQuantizer(reduce_range=True) on such CPUs"
        )
    else:
        meaning = "no x86 int8 instructions found: the int8 kernels may not apply; expect no speed-up"
    return listed, meaning


@contextlib.contextmanager
def output_dir(out: Path | None) -> Iterator[Path]:
    """``out`` (created), or a temporary directory removed afterwards: nothing is left behind."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="quantweave-quickstart-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=int, default=None, help="input size (default 224; 32 with --tiny)")
    parser.add_argument("--calibration", type=int, default=None, help="calibration batches (default 8; 2 with --tiny)")
    parser.add_argument("--iters", type=int, default=None, help="timed runs (default 20; 3 with --tiny)")
    parser.add_argument("--out", type=Path, default=None, help="save the fp32 and int8 programs here (default: none)")
    parser.add_argument("--tiny", action="store_true", help="a small model and short runs (what CI runs)")
    args = parser.parse_args(argv)
    image = args.image or (32 if args.tiny else 224)
    calibration = args.calibration or (2 if args.tiny else 8)
    iters = args.iters or (3 if args.tiny else 20)

    import quantweave_x86

    model = resnet18_like(blocks=(1, 1), width=16, num_classes=10) if args.tiny else resnet18_like()
    (x,) = example_inputs(model, image=image)
    timings: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., Any], *a: Any) -> Any:
        start = time.perf_counter()
        result = fn(*a)
        timings[name] = time.perf_counter() - start
        return result

    # 7-bit activations where the CPU has no VNNI / AMX (lower() warns about full-range ones there)
    quantizer = qw.get_quantizer("x86", reduce_range=quantweave_x86.cpu_needs_reduce_range())
    exported = timed("export", lambda: torch.export.export(model, (x,)).module())
    prepared = timed("prepare_pt2e", qw.prepare_pt2e, exported, quantizer)
    batches = calibration_batches(model, calibration, image=image)  # batch 1, as exported
    calibrated = timed("calibrate", qw.calibrate, prepared, batches)  # a progress bar on a terminal
    converted = timed("convert_pt2e", qw.convert_pt2e, prepared)
    report = qw.annotation_report(prepared, quantizer)
    with torch.no_grad():
        reference, reference_qdq = model(x), converted(x)

    with output_dir(args.out) as out_dir:
        fp32_path, int8_path = out_dir / "resnet18_like_fp32.pt2", out_dir / "resnet18_like_int8.pt2"
        torch.export.save(torch.export.export(model, (x,)), fp32_path)
        timed("save (int8)", qw.save, converted, (x,), int8_path)
        loaded = timed("load (int8)", qw.load, int8_path)
        round_trip = torch.equal(loaded(x), reference_qdq)
        fp32_size, int8_size = fp32_path.stat().st_size, int8_path.stat().st_size

    # backend lowering: from here on, x86-specific (the q/dq model above is backend-neutral)
    int8 = timed("lower (int8)", quantweave_x86.lower, converted, (x,))
    fp32 = timed("compile (fp32)", compile_float, model, (x,))
    fp32_latency, int8_latency = latency(fp32, (x,), iters), latency(int8, (x,), iters)
    features, meaning = int8_speed_note(cpu_flags())

    shape = f"1x3x{image}x{image}"
    kind = "tiny ResNet-like" if args.tiny else "ResNet-18-like"
    print(f"model            {kind}, input {shape}, {calibration} calibration batches")
    print(f"plugins          {', '.join(f'{p.name} ({p.status})' for p in qw.plugins())}")
    print(f"quantizer        {quantizer!r}")
    for name, seconds in timings.items():
        print(f"{name:<16} {seconds:8.3f} s")
    print(f"calibration      {calibrated}")
    why = ", ".join(f"{count} {kind}" for kind, count in sorted(report.float_by_kind().items()))
    print(
        f"annotated        {report.quantized} compute nodes quantized, {report.float} float"
        + (f" ({why})" if why else "")
    )
    print(
        f"SQNR vs float    {sqnr(reference, int8(x)):.2f} dB (compiled int8), "
        f"{sqnr(reference, reference_qdq):.2f} dB (reference q/dq)"
    )
    where = f"  -> {out_dir}" if args.out else " (not kept: --out DIR saves them)"
    sizes = f"fp32 {fp32_size / 1e6:.2f} MB, int8 {int8_size / 1e6:.2f} MB ({int8_size / fp32_size:.3f}x)"
    print(f"saved size       {sizes}{where}")
    print(f"save/load        {'identical outputs' if round_trip else 'OUTPUTS DIFFER'}")
    print(f"CPU int8         {features}")
    print(f"                 {meaning}")
    print(
        f"latency (b1)     fp32 {fp32_latency * 1e3:.2f} ms, int8 {int8_latency * 1e3:.2f} ms "
        f"({fp32_latency / int8_latency:.2f}x faster; median of {iters} runs)"
    )
    return 0 if round_trip else 1


if __name__ == "__main__":
    raise SystemExit(main())

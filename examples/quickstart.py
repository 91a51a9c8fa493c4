"""quantweave quickstart: quantize a bundled model end to end and report what happened.

Runs on a fresh machine with only ``torch==2.13.0`` and ``quantweave`` installed:

1. builds the bundled ResNet-18-like model (deterministic weights, eval mode) and its
   bundled calibration data (deterministic synthetic images);
2. exports it with default ``torch.export``;
3. ``prepare_pt2e`` with the reference quantizer (uint8 per-tensor activations, int8
   per-channel weights), calibrates, ``convert_pt2e``;
4. prints timings, accuracy of the int8 model against float (SQNR) and the size of the
   saved fp32 and int8 ``torch.export`` programs, and checks the saved int8 program reloads
   with identical outputs.

Options: ``--image N`` (input size, default 64), ``--calibration N`` (batches, default 8),
``--out DIR`` (where to save the programs; default a temporary directory).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import torch

import quantweave as qw
from quantweave.testing.inspect import count_ops, sqnr
from quantweave.testing.models import calibration_batches, example_inputs, resnet18_like
from quantweave.testing.reference import make_reference_quantizer

warnings.filterwarnings("ignore", message=".*LeafSpec.*")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--calibration", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    model = resnet18_like()
    (x,) = example_inputs(model, image=args.image)
    timings: dict[str, float] = {}

    def timed(name, fn, *a):
        start = time.perf_counter()
        result = fn(*a)
        timings[name] = time.perf_counter() - start
        return result

    exported = timed("export", lambda: torch.export.export(model, (x,)).module())
    prepared = timed("prepare_pt2e", qw.prepare_pt2e, exported, make_reference_quantizer())
    batches = calibration_batches(model, args.calibration, image=args.image)  # batch 1, as exported
    timed("calibrate", lambda: [prepared(*b) for b in batches])
    converted = timed("convert_pt2e", qw.convert_pt2e, prepared)

    with torch.no_grad():
        reference, quantized = model(x), converted(x)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="quantweave-quickstart-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    fp32_path, int8_path = out_dir / "resnet18_like_fp32.pt2", out_dir / "resnet18_like_int8.pt2"
    torch.export.save(torch.export.export(model, (x,)), fp32_path)
    torch.export.save(torch.export.export(converted, (x,)), int8_path)
    reloaded = torch.export.load(int8_path).module()
    round_trip = torch.equal(reloaded(x), quantized)

    qd = torch.ops.quantized_decomposed
    print(
        f"model           ResNet-18-like, input 1x3x{args.image}x{args.image}, {args.calibration} calibration batches"
    )
    for name, seconds in timings.items():
        print(f"{name:<15} {seconds:8.3f} s")
    print(
        f"quantized ops   {count_ops(converted, (qd.quantize_per_tensor.default,))} activation quantize, "
        f"{count_ops(converted, (qd.dequantize_per_channel.default,))} per-channel weight dequantize"
    )
    print(f"SQNR vs float   {sqnr(reference, quantized):8.2f} dB")
    fp32_size, int8_size = fp32_path.stat().st_size, int8_path.stat().st_size
    print(
        f"saved size      fp32 {fp32_size / 1e6:.1f} MB, int8 {int8_size / 1e6:.1f} MB "
        f"({int8_size / fp32_size:.3f}x)  -> {out_dir}"
    )
    print(f"save/load       {'identical outputs' if round_trip else 'OUTPUTS DIFFER'}")
    return 0 if round_trip else 1


if __name__ == "__main__":
    raise SystemExit(main())

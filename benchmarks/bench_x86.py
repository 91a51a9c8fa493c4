"""quantweave-x86 vs torchao's X86InductorQuantizer vs fp32, all compiled with inductor.

One run measures, for ResNet-18-like (224x224) and a transformer encoder block (d512, 8
heads, ff 2048, seq 128), at batch 1 and 32:

- fp32 compiled (inductor, freezing),
- quantweave-x86 int8 (X86InductorQuantizer -> prepare/convert -> quantweave_x86.lower),
- torchao int8 (its X86InductorQuantizer -> prepare/convert -> torch.compile with freezing),

and prints latency, the ratios quantweave/torchao and fp32/quantweave, and SQNR vs float.
Every variant runs in its own interpreter: importing torchao's x86 quantizer changes global
inductor configuration, which must not leak into the other measurements.

    python benchmarks/bench_x86.py [--quick] [--iters N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

WORKER = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(2)
from quantweave.testing import models
from quantweave.testing.inspect import sqnr

model_name, variant = sys.argv[1], sys.argv[3]
batch, iters, image, calib = (int(v) for v in (sys.argv[2], sys.argv[4], sys.argv[5], sys.argv[6]))
if model_name == "resnet18":
    model = models.resnet18_like()
    make = lambda seed: (torch.randn(batch, 3, image, image, generator=torch.Generator().manual_seed(seed)),)
else:
    model = models.encoder_block(d_model=512, heads=8, ff=2048)
    make = lambda seed: (torch.randn(batch, 128, 512, generator=torch.Generator().manual_seed(seed)),)
inputs = make(0)
held_out = make(12345)
calibration = [make(100 + i) for i in range(calib)]
with torch.no_grad():
    reference = model(*held_out)
timings = {}
t0 = time.perf_counter()
if variant == "fp32":
    import torch._inductor.config as cfg
    with torch.no_grad(), cfg.patch(freezing=True):
        run = torch.compile(torch.export.export(model, inputs).module())
        run(*inputs)
    def call(*a):
        with torch.no_grad(), cfg.patch(freezing=True):
            return run(*a)
elif variant == "quantweave":
    import quantweave as qw
    import quantweave_x86
    prepared = qw.prepare_pt2e(torch.export.export(model, inputs).module(), quantweave_x86.X86InductorQuantizer())
    for b in calibration:
        prepared(*b)
    call = quantweave_x86.lower(qw.convert_pt2e(prepared), inputs)
else:
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, convert_pt2e
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    import torch._inductor.config as cfg
    q = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), q)
    for b in calibration:
        prepared(*b)
    converted = convert_pt2e(prepared)
    with torch.no_grad(), cfg.patch(freezing=True):
        run = torch.compile(converted)
        run(*inputs)
    def call(*a):
        with torch.no_grad(), cfg.patch(freezing=True):
            return run(*a)
timings["build_s"] = time.perf_counter() - t0
out = call(*held_out)
for _ in range(3):
    call(*inputs)
samples = []
for _ in range(iters):
    t = time.perf_counter()
    call(*inputs)
    samples.append(time.perf_counter() - t)
samples.sort()
result = {"median_s": samples[len(samples) // 2], "min_s": samples[0], "sqnr_db": sqnr(reference, out)}
print(json.dumps({**result, **timings}))
"""


def run_variant(model: str, batch: int, variant: str, iters: int, image: int, calib: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, model, str(batch), variant, str(iters), str(image), str(calib)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64x64 images, batch 1 and 4, few iterations")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--models", nargs="+", choices=("resnet18", "encoder"), default=("resnet18", "encoder"))
    parser.add_argument("--batches", nargs="+", type=int, default=None, help="batch sizes (default 1 32)")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    image, batches, iters, calib = (64, (1, 4), 5, 2) if args.quick else (224, (1, 32), 30, 8)
    batches = tuple(args.batches or batches)
    iters = args.iters or iters
    results = []
    started = time.perf_counter()
    for model in args.models:
        for batch in batches:
            row = {"model": model, "batch": batch}
            for variant in ("fp32", "quantweave", "torchao"):
                n = max(5, iters // 4) if batch > 8 else iters
                row[variant] = run_variant(model, batch, variant, n, image, calib)
            results.append(row)
            print(_format(row), flush=True)
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


def _ms(result: dict) -> str:
    return f"{result['median_s'] * 1e3:8.2f} ms" if "median_s" in result else f"error: {result.get('error')}"


def _format(row: dict) -> str:
    fp32, qw, ao = row["fp32"], row["quantweave"], row["torchao"]
    parts = [f"{row['model']:<9} b{row['batch']:<3} fp32 {_ms(fp32)} | quantweave {_ms(qw)} | torchao {_ms(ao)}"]
    if "median_s" in qw and "median_s" in ao:
        parts.append(f"qw/ao {qw['median_s'] / ao['median_s']:.2f}x")
    if "median_s" in qw and "median_s" in fp32:
        parts.append(f"fp32/qw {fp32['median_s'] / qw['median_s']:.2f}x")
    if "sqnr_db" in qw and "sqnr_db" in ao:
        parts.append(
            f"SQNR qw {qw['sqnr_db']:.2f} dB, ao {ao['sqnr_db']:.2f} dB (diff {qw['sqnr_db'] - ao['sqnr_db']:+.2f})"
        )
    return " | ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())

"""quantweave-x86 vs torchao's X86InductorQuantizer vs fp32, all compiled with inductor.

One run measures, for ResNet-18-like (224x224) and a transformer encoder block (d512, 8
heads, ff 2048, seq 128), at batch 1 and 32:

- fp32 compiled (inductor, freezing),
- quantweave-x86 int8 (X86InductorQuantizer -> prepare/convert -> quantweave_x86.lower),
- torchao int8 (its X86InductorQuantizer -> prepare/convert -> torch.compile with freezing),

and prints latency, the ratios quantweave/torchao and fp32/quantweave, SQNR vs float, and
whether inductor generated the same kernels for both int8 models (the extern oneDNN calls
and the number of fused C++ kernels in the compiled code).
Each (model, batch) runs in one fresh interpreter: fp32 and quantweave are compiled first,
then torchao is imported (its x86 quantizer installs inductor passes globally) and
compiled; the three are then timed in interleaved rounds (rotating order) so that machine
noise hits all three alike, and the median of all timed calls is reported.

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

model_name = sys.argv[1]
batch, iters, image, calib, rounds = (int(v) for v in sys.argv[2:7])
if model_name == "resnet18":
    model = models.resnet18_like()
    make = lambda seed: (torch.randn(batch, 3, image, image, generator=torch.Generator().manual_seed(seed)),)
else:
    model = models.encoder_block(d_model=512, heads=8, ff=2048)
    make = lambda seed: (torch.randn(batch, 128, 512, generator=torch.Generator().manual_seed(seed)),)
inputs, held_out = make(0), make(12345)
calibration = [make(100 + i) for i in range(calib)]
with torch.no_grad():
    reference = model(*held_out)
import torch._inductor.config as cfg
import collections, re
from unittest import mock
from torch._inductor.graph import GraphLowering
cfg.fx_graph_cache = False  # every variant's code is generated here (and can be compared)

def kernels(build_and_run):
    # what inductor generated: extern kernel calls (oneDNN int8 conv/linear...) and the
    # number of distinct fused C++ kernels (no dynamo reset: compiled variants stay as they are)
    codes = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        result = build_and_run()
    code = "\n".join(codes)
    calls = collections.Counter(re.findall(r"torch\.ops\.(\w+\.\w+)", code))
    calls.pop("inductor._alloc_from_pool", None)
    return result, {"extern": dict(sorted(calls.items())), "cpp_kernels": len(set(re.findall(r"cpp_fused_\w+", code)))}

def frozen(run):
    def call(*a):
        with torch.no_grad(), cfg.patch(freezing=True):
            return run(*a)
    return call

variants, build = {}, {}
# 1. fp32 and quantweave are compiled before torchao is imported: importing torchao's x86
#    quantizer installs torchao's inductor passes globally, and must not shape our code.
t0 = time.perf_counter()
variants["fp32"] = frozen(torch.compile(torch.export.export(model, inputs).module()))
variants["fp32"](*inputs)
build["fp32"] = time.perf_counter() - t0
import quantweave as qw
import quantweave_x86
t0 = time.perf_counter()
prepared = qw.prepare_pt2e(torch.export.export(model, inputs).module(), quantweave_x86.X86InductorQuantizer())
for b in calibration:
    prepared(*b)
converted = qw.convert_pt2e(prepared)
variants["quantweave"], code_qw = kernels(lambda: quantweave_x86.lower(converted, inputs))
build["quantweave"] = time.perf_counter() - t0
# 2. the peer, compiled the way its documentation shows
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, convert_pt2e
import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
t0 = time.perf_counter()
q = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
prepared = prepare_pt2e(torch.export.export(model, inputs).module(), q)
for b in calibration:
    prepared(*b)
variants["torchao"] = frozen(torch.compile(convert_pt2e(prepared)))
_, code_ao = kernels(lambda: variants["torchao"](*inputs))
build["torchao"] = time.perf_counter() - t0
# 3. interleaved timing: every round times each variant, in rotating order
samples = {name: [] for name in variants}
names = list(variants)
for call in variants.values():
    for _ in range(2):
        call(*inputs)
for r in range(rounds):
    for name in names[r % len(names):] + names[: r % len(names)]:
        call = variants[name]
        for _ in range(iters):
            t = time.perf_counter()
            call(*inputs)
            samples[name].append(time.perf_counter() - t)
result = {}
for name, call in variants.items():
    times = sorted(samples[name])
    out = call(*held_out)
    result[name] = {"median_s": times[len(times) // 2], "min_s": times[0], "runs": len(times),
                    "sqnr_db": sqnr(reference, out.float()), "build_s": build[name]}
result["kernels"] = {"quantweave": code_qw, "torchao": code_ao, "identical": code_qw == code_ao}
print(json.dumps(result))
"""


def run_case(model: str, batch: int, iters: int, image: int, calib: int, rounds: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, model, str(batch), str(iters), str(image), str(calib), str(rounds)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        error = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        return {v: {"error": error} for v in ("fp32", "quantweave", "torchao")} | {"kernels": None}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64x64 images, batch 1 and 4, few iterations")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per variant per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--models", nargs="+", choices=("resnet18", "encoder"), default=("resnet18", "encoder"))
    parser.add_argument("--batches", nargs="+", type=int, default=None, help="batch sizes (default 1 32)")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    image, batches, iters, calib = (64, (1, 4), 3, 2) if args.quick else (224, (1, 32), 10, 8)
    batches = tuple(args.batches or batches)
    results = []
    started = time.perf_counter()
    for model in args.models:
        for batch in batches:
            n = args.iters or (max(2, iters // 4) if batch > 8 else iters)
            row = {"model": model, "batch": batch, **run_case(model, batch, n, image, calib, args.rounds)}
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
    kernels = row.get("kernels")
    if kernels:
        parts.append("same inductor kernels" if kernels["identical"] else f"KERNELS DIFFER: {kernels}")
    return " | ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())

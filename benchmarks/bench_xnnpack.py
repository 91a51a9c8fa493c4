"""quantweave-xnnpack on the ExecuTorch runtime, and its quantize time vs ExecuTorch's own.

Needs ExecuTorch 1.5.1 (installed as in plugins/xnnpack/README.md: ``--no-deps``). For a
MobileNetV2-like CNN (224x224, width 32) and a transformer encoder block (d512, 8 heads,
ff 2048, seq 128), batch 1, one run measures:

1. **ExecuTorch runtime latency**, int8 vs fp32: the fp32 model and the quantweave-xnnpack
   int8 model (static, per-channel weights) are each lowered with ``to_executorch`` (the
   XNNPACK partitioner) and loaded on the ExecuTorch runtime; after warm-up the two
   programs' ``forward`` are timed in interleaved rounds and the median call is reported.
2. **quantize time**, quantweave-xnnpack vs ExecuTorch's ``XNNPACKQuantizer`` with
   torchao 0.18's ``prepare_pt2e`` / ``convert_pt2e``, same config (static per-channel),
   same export, same calibration batches. Timed: ``prepare_pt2e`` (transform for
   annotation + annotate + observer insertion) + calibration (``--calib`` forward passes)
   + ``convert_pt2e``; ``torch.export`` is not timed (identical on both sides). Each side
   runs ``--repeats`` times on fresh exports (alternating), the best run is reported.

    python benchmarks/bench_xnnpack.py [--quick] [--iters N] [--calib N] [--repeats N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from typing import Any

import torch

warnings.filterwarnings("ignore")


def build(name: str, quick: bool) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    from quantweave.testing import models

    if name == "mobilenet_v2":
        if quick:
            model = models.mobilenet_v2_like(width=16, num_classes=100)
            image = 96
        else:
            model = models.mobilenet_v2_like(width=32, num_classes=1000, stages=(1, 2, 3, 4, 3))
            image = 224
        inputs = models.example_inputs(model, image=image)
        return model, inputs, models.calibration_batches(model, 8, image=image)
    if quick:
        model = models.encoder_block(d_model=128, heads=4, ff=512)
        seq = 64
    else:
        model = models.encoder_block(d_model=512, heads=8, ff=2048)
        seq = 128
    inputs = models.example_inputs(model, seq=seq)
    return model, inputs, models.calibration_batches(model, 8, seq=seq)


def quantize_ours(model: torch.nn.Module, inputs: Any, calib: Any) -> tuple[Any, float]:
    import quantweave as qw
    import quantweave_xnnpack as qx

    exported = torch.export.export(model, inputs).module()
    start = time.perf_counter()
    quantizer = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(is_per_channel=True))
    prepared = qw.prepare_pt2e(exported, quantizer)
    for batch in calib:
        prepared(*batch)
    converted = qw.convert_pt2e(prepared)
    return converted, time.perf_counter() - start


def quantize_peer(model: torch.nn.Module, inputs: Any, calib: Any) -> tuple[Any, float]:
    from executorch.backends.xnnpack.quantizer import xnnpack_quantizer as xq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    exported = torch.export.export(model, inputs).module()
    start = time.perf_counter()
    quantizer = xq.XNNPACKQuantizer().set_global(xq.get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(exported, quantizer)
    for batch in calib:
        prepared(*batch)
    converted = convert_pt2e(prepared)
    return converted, time.perf_counter() - start


def latency(programs: dict[str, Any], inputs: tuple[torch.Tensor, ...], iters: int, rounds: int = 5) -> dict:
    """Median seconds per forward call of each loaded program, timed in interleaved rounds."""
    runners = {name: program.load() for name, program in programs.items()}
    for runner in runners.values():
        for _ in range(max(3, iters // 10)):
            runner(*inputs)
    times: dict[str, list[float]] = {name: [] for name in runners}
    per_round = max(1, iters // rounds)
    for r in range(rounds):
        order = list(runners)[r % 2 :] + list(runners)[: r % 2]
        for name in order:
            runner = runners[name]
            for _ in range(per_round):
                start = time.perf_counter()
                runner(*inputs)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small models (a smoke run, not the recorded figures)")
    parser.add_argument("--iters", type=int, default=200, help="timed runtime calls per program")
    parser.add_argument("--calib", type=int, default=8, help="calibration batches")
    parser.add_argument("--repeats", type=int, default=3, help="quantize runs per side (best reported)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    import quantweave_xnnpack as qx
    from quantweave.testing.inspect import sqnr

    torch.set_num_threads(2)
    results: dict[str, Any] = {}
    for name in ("mobilenet_v2", "transformer_block"):
        model, inputs, calib = build(name, args.quick)
        calib = calib[: args.calib]
        ours_times, peer_times = [], []
        converted = None
        for _ in range(args.repeats):
            converted, t = quantize_ours(model, inputs, calib)
            ours_times.append(t)
            _, t = quantize_peer(model, inputs, calib)
            peer_times.append(t)
        assert converted is not None
        fp32 = qx.to_executorch(model, inputs)
        int8 = qx.to_executorch(converted, inputs)
        lat = latency({"fp32": fp32, "int8": int8}, inputs, args.iters)
        (out_int8,) = int8.load()(*inputs)
        (out_fp32,) = fp32.load()(*inputs)
        reference = model(*inputs)
        row = {
            "nodes_delegated_int8": sum(int8.delegated.values()),
            "not_delegated_int8": dict(int8.not_delegated),
            "latency_fp32_ms": lat["fp32"] * 1e3,
            "latency_int8_ms": lat["int8"] * 1e3,
            "speedup_int8_vs_fp32": lat["fp32"] / lat["int8"],
            "program_bytes_fp32": len(fp32.buffer),
            "program_bytes_int8": len(int8.buffer),
            "sqnr_int8_runtime_vs_float_db": sqnr(reference, out_int8),
            "sqnr_fp32_runtime_vs_float_db": sqnr(reference, out_fp32),
            "quantize_s_quantweave": min(ours_times),
            "quantize_s_executorch": min(peer_times),
            "quantize_ratio_quantweave_vs_executorch": min(ours_times) / min(peer_times),
        }
        results[name] = row
        shape = "x".join(str(d) for d in inputs[0].shape)
        print(f"\n{name} (input {shape}, batch 1)")
        print(
            f"  ExecuTorch runtime: fp32 {row['latency_fp32_ms']:.3f} ms, int8 {row['latency_int8_ms']:.3f} ms "
            f"-> int8 {row['speedup_int8_vs_fp32']:.2f}x faster; program {row['program_bytes_fp32'] / 1e6:.2f} MB "
            f"-> {row['program_bytes_int8'] / 1e6:.2f} MB"
        )
        print(
            f"  delegated int8 nodes {row['nodes_delegated_int8']}, "
            f"not delegated {row['not_delegated_int8'] or 'none'}; "
            f"SQNR vs float: int8 {row['sqnr_int8_runtime_vs_float_db']:.1f} dB, "
            f"fp32 {row['sqnr_fp32_runtime_vs_float_db']:.1f} dB"
        )
        print(
            f"  quantize (prepare + {len(calib)} calibration batches + convert, best of {args.repeats}): "
            f"quantweave-xnnpack {row['quantize_s_quantweave']:.3f} s, ExecuTorch+torchao "
            f"{row['quantize_s_executorch']:.3f} s -> ratio {row['quantize_ratio_quantweave_vs_executorch']:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

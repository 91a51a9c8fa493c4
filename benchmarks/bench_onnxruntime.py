"""quantweave-onnxruntime vs ONNX Runtime's own quantize_static vs fp32, on ONNX Runtime (issue 28).

The same float CNN (3 convs, residual add, max pool, global average pool, linear; batch 8,
64x64) is quantized two ways with the same calibration batches:

- ours: quantweave + ORTQuantizer (export, prepare, calibrate, convert, export_onnx);
- ORT:  the float model exported to ONNX, then onnxruntime.quantization.quantize_static
        (QDQ, per-channel, uint8 activations / int8 weights, MinMax calibration);

and both run on ONNX Runtime's CPU provider with 2 intra-op threads, against the fp32 ONNX
model. Latencies are medians of interleaved repetitions (fp32, ours, ORT, fp32, ...). Printed:
quantize time, SQNR vs the float PyTorch model, model size, int8 kernels / convs + gemms in
ORT's optimized graph, latency and ratios, the CPU's int8 flags and the load average.

    pip install torch==2.13.0 numpy onnx onnxscript onnxruntime ./core ./plugins/onnxruntime
    python benchmarks/bench_onnxruntime.py [--reps 50] [--channels 32] [--observer histogram|minmax]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnxruntime import quantization

import quantweave as qw
from quantweave_onnxruntime import ORTQuantizer, export_onnx, int8_kernels, ort_session


class CNN(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.c2 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.c3 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.fc = torch.nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c1(x))
        y = self.c3(F.relu(self.c2(x)))
        z = F.max_pool2d(F.relu(y + x), 2)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(z, 1), 1))


class Reader(quantization.CalibrationDataReader):
    def __init__(self, name: str, batches: list[torch.Tensor]) -> None:
        self.feeds = iter([{name: b.numpy()} for b in batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def cpu_flags() -> str:
    info = Path("/proc/cpuinfo")
    flags = set(info.read_text().split()) if info.exists() else set()
    found = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return " ".join(found) or "unknown"


def sqnr(reference: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10((reference**2).mean() / ((reference - got) ** 2).mean()))


def kernels(path: Path) -> str:
    ops = int8_kernels(path)
    int8 = ops.get("QLinearConv", 0) + ops.get("QGemm", 0) + ops.get("MatMulInteger", 0) + ops.get("QLinearMatMul", 0)
    total = int8 + ops.get("Conv", 0) + ops.get("FusedConv", 0) + ops.get("Gemm", 0) + ops.get("MatMul", 0)
    return f"{int8}/{total}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--observer", choices=("histogram", "minmax"), default="histogram")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = CNN(args.channels).eval()
    batches = [torch.randn(8, 3, 64, 64) for _ in range(8)]
    x = torch.randn(8, 3, 64, 64)
    flags = cpu_flags()
    # no VNNI: u8 x s8 kernels saturate with full-range weights; ORT's advice is reduce_range (both get it)
    reduce_range = not any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        # warm-up, untimed: the first torch.export / torch.onnx.export in a process pays one-time costs
        export_onnx(model, (x,), d / "warmup.onnx")
        start = time.perf_counter()
        prepared = qw.prepare_pt2e(
            torch.export.export(model, (x,)).module(), ORTQuantizer(reduce_range=reduce_range, observer=args.observer)
        )
        for b in batches:
            prepared(b)
        ours = export_onnx(qw.convert_pt2e(prepared), (x,), d / "ours.onnx")
        ours_time = time.perf_counter() - start

        start = time.perf_counter()
        fp32 = export_onnx(model, (x,), d / "fp32.onnx")
        name = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).get_inputs()[0].name
        theirs = d / "ort.onnx"
        quantization.quantize_static(
            str(fp32),
            str(theirs),
            Reader(name, batches),
            quant_format=quantization.QuantFormat.QDQ,
            per_channel=True,
            reduce_range=reduce_range,
            activation_type=quantization.QuantType.QUInt8,
            weight_type=quantization.QuantType.QInt8,
        )
        ort_time = time.perf_counter() - start

        paths = {"fp32": fp32, "ours": ours, "ORT": theirs}
        sessions = {k: ort_session(p, intra_op_threads=2) for k, p in paths.items()}
        feed = {name: x.numpy()}
        reference = model(x).detach().numpy()
        outputs = {k: s.run(None, feed)[0] for k, s in sessions.items()}
        for s in sessions.values():
            for _ in range(5):
                s.run(None, feed)
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for _ in range(args.reps):
            for k, s in sessions.items():
                t = time.perf_counter()
                s.run(None, feed)
                times[k].append(time.perf_counter() - t)
        median = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        quantize = {"fp32": None, "ours": ours_time, "ORT": ort_time}
        print(
            f"CNN 3 convs + residual add + pools + linear, {args.channels} channels, batch 8, 64x64; {args.reps} reps"
        )
        print(
            f"CPU int8 flags: {flags}; reduce_range={reduce_range}; "
            f"onnxruntime {ort.__version__}, torch {torch.__version__}"
        )
        print(f"{'model':6} {'quantize s':>10} {'SQNR dB':>8} {'size KB':>8} {'int8 kernels':>12} {'latency ms':>10}")
        for k, p in paths.items():
            q = "-" if quantize[k] is None else f"{quantize[k]:.2f}"
            s = "-" if k == "fp32" else f"{sqnr(reference, outputs[k]):.2f}"
            kern = "-" if k == "fp32" else kernels(p)
            print(f"{k:6} {q:>10} {s:>8} {p.stat().st_size / 1024:8.1f} {kern:>12} {median[k]:10.3f}")
        print(
            f"ratios: ours/ORT latency {median['ours'] / median['ORT']:.3f}x, fp32/ours speed-up "
            f"{median['fp32'] / median['ours']:.2f}x, fp32/ORT {median['fp32'] / median['ORT']:.2f}x, "
            f"quantize time ours/ORT {ours_time / ort_time:.2f}x"
        )
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (2 cores)", file=sys.stdout)


if __name__ == "__main__":
    main()

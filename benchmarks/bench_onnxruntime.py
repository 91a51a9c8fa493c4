"""quantweave-onnxruntime vs ONNX Runtime's own quantizer vs fp32, on ONNX Runtime (issue 28).

Each float model is quantized two ways with the same calibration batches:

- ours: quantweave + ORTQuantizer (torch.export, prepare, calibrate, convert, to_onnx);
- ORT:  the float model exported to ONNX with the same exporter, then ORT's own quantizer:
        static: quant_pre_process + quantize_static (QDQ, per-channel, uint8 activations / int8
        weights, MinMax calibration); dynamic: quantize_dynamic (per-channel int8 weights);

and the three models run on ONNX Runtime's CPU provider (2 intra-op threads). Models:

- cnn:        the issue's CNN (3 convs, residual add, max pool, global average pool, linear;
              batch 8, 64x64);
- mobilenet:  MobileNetV2-like (conv-bn-relu6 stem, 4 inverted residual blocks with depthwise
              convs, global pool, linear; batch 8, 64x64);
- block:      a pre-norm transformer encoder block (d=128, 4 heads, 64 tokens, batch 8;
              projections, attention matmuls, softmax, GELU MLP), static and dynamic;
- bert:       transformers' BertModel from a config (random init, nothing downloaded: 4 layers,
              hidden 128, 4 heads, eager attention; 64 tokens, batch 8), static and dynamic
              (skipped when transformers is not installed).

Latencies are medians of interleaved repetitions (fp32, ours, ORT, fp32, ...). Printed per
model: quantize time (export included), SQNR vs the float PyTorch model, model size, int8
products / all conv + matmul + gemm products in ORT's optimized graph, latency and ratios; then
the CPU's int8 flags and the load average.

    pip install torch==2.13.0 numpy onnx onnxscript onnxruntime transformers ./core ./plugins/onnxruntime
    python benchmarks/bench_onnxruntime.py [--reps 50] [--models cnn,mobilenet,block,bert] [--observer minmax]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnxruntime import quantization
from onnxruntime.quantization.shape_inference import quant_pre_process

import quantweave as qw
from quantweave_onnxruntime import ORTQuantizer, int8_kernels, ort_session, to_onnx

INT8_PRODUCTS = (
    "QLinearConv",
    "QGemm",
    "QLinearMatMul",
    "MatMulInteger",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
)
FLOAT_PRODUCTS = ("Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul", "FusedMatMul", "MatMulNBits", "ConvTranspose")


class CNN(torch.nn.Module):
    def __init__(self, channels: int = 32) -> None:
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


def _conv_bn(
    cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1, act: bool = True
) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = [
        torch.nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
        torch.nn.BatchNorm2d(cout),
    ]
    if act:
        layers.append(torch.nn.ReLU6())
    return torch.nn.Sequential(*layers)


class InvertedResidual(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.body = torch.nn.Sequential(
            _conv_bn(cin, hidden),
            _conv_bn(hidden, hidden, 3, stride, groups=hidden),
            _conv_bn(hidden, cout, act=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetLike(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 16, 3, 2)
        self.blocks = torch.nn.Sequential(
            InvertedResidual(16, 24, 2),
            InvertedResidual(24, 24, 1),
            InvertedResidual(24, 32, 2),
            InvertedResidual(32, 32, 1),
        )
        self.head = _conv_bn(32, 128)
        self.fc = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class Block(torch.nn.Module):
    def __init__(self, d: int = 128, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(3))
        self.out = torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (p(h).reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for p in self.qkv)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (d // self.heads) ** -0.5
        attended = torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(attended)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def bert() -> torch.nn.Module | None:
    try:
        import transformers
    except ImportError:
        return None
    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=128,
        attn_implementation="eager",
    )

    class Bert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertModel(config, add_pooling_layer=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).last_hidden_state

    return Bert()


class Reader(quantization.CalibrationDataReader):
    def __init__(self, name: str, batches: list[torch.Tensor]) -> None:
        self.feeds = iter([{name: b.numpy()} for b in batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def cpu_flags() -> str:
    info = Path("/proc/cpuinfo")
    flags = set(info.read_text().split()) if info.exists() else set()
    found = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8") if f in flags]
    return " ".join(found) or "unknown"


def sqnr(reference: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10((reference**2).mean() / max(float(((reference - got) ** 2).mean()), 1e-30)))


def products(path: Path) -> str:
    ops = int8_kernels(path)
    int8 = sum(ops.get(op, 0) for op in INT8_PRODUCTS)
    return f"{int8}/{int8 + sum(ops.get(op, 0) for op in FLOAT_PRODUCTS)}"


def case(
    name: str,
    model: torch.nn.Module,
    make: Callable[[], torch.Tensor],
    dynamic: bool,
    args: Any,
    d: Path,
    reduce_range: bool,
) -> None:
    torch.manual_seed(1)
    batches = [make() for _ in range(8)]
    x = make()
    model = model.eval()
    to_onnx(model, (x,), d / f"{name}_warmup.onnx")  # untimed: first-export costs of this model
    start = time.perf_counter()
    quantizer = ORTQuantizer(is_dynamic=dynamic, reduce_range=reduce_range, observer=args.observer)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    for b in batches[: 1 if dynamic else None]:
        prepared(b)  # dynamic: one pass (weights only are observed)
    ours = to_onnx(qw.convert_pt2e(prepared), (x,), d / f"{name}_ours.onnx")
    ours_time = time.perf_counter() - start

    start = time.perf_counter()
    fp32 = to_onnx(model, (x,), d / f"{name}_fp32.onnx")
    input_name = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).get_inputs()[0].name
    theirs = d / f"{name}_ort.onnx"
    if dynamic:
        quantization.quantize_dynamic(
            str(fp32),
            str(theirs),
            per_channel=True,
            reduce_range=reduce_range,
            weight_type=quantization.QuantType.QInt8,
        )
    else:
        pre = d / f"{name}_pre.onnx"
        quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
        quantization.quantize_static(
            str(pre),
            str(theirs),
            Reader(input_name, batches),
            quant_format=quantization.QuantFormat.QDQ,
            per_channel=True,
            reduce_range=reduce_range,
            activation_type=quantization.QuantType.QUInt8,
            weight_type=quantization.QuantType.QInt8,
        )
    ort_time = time.perf_counter() - start

    paths = {"fp32": fp32, "ours": ours, "ORT": theirs}
    sessions = {k: ort_session(p, intra_op_threads=2) for k, p in paths.items()}
    feed = {input_name: x.numpy()}
    reference = model(x).detach().numpy()
    outputs = {k: s.run(None, feed)[0] for k, s in sessions.items()}
    for s in sessions.values():
        for _ in range(3):
            s.run(None, feed)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(args.reps):
        for k, s in sessions.items():
            t = time.perf_counter()
            s.run(None, feed)
            times[k].append(time.perf_counter() - t)
    median = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    quantize = {"fp32": None, "ours": ours_time, "ORT": ort_time}
    label = f"{name} ({'dynamic' if dynamic else 'static'})"
    for k, p in paths.items():
        q = "-" if quantize[k] is None else f"{quantize[k]:.2f}"
        s = "-" if k == "fp32" else f"{sqnr(reference, outputs[k]):.2f}"
        kern = "-" if k == "fp32" else products(p)
        print(f"{label:20} {k:5} {q:>10} {s:>8} {p.stat().st_size / 1024:9.1f} {kern:>9} {median[k]:10.3f}")
    print(
        f"{label:20} ratios: ours/ORT latency {median['ours'] / median['ORT']:.3f}x, fp32/ours "
        f"{median['fp32'] / median['ours']:.2f}x, fp32/ORT {median['fp32'] / median['ORT']:.2f}x, "
        f"quantize time ours/ORT {ours_time / ort_time:.2f}x; load {os.getloadavg()[0]:.2f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--models", default="cnn,mobilenet,block,bert")
    parser.add_argument("--observer", choices=("histogram", "minmax"), default="histogram")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    flags = cpu_flags()
    # no VNNI: u8 x s8 kernels saturate with full-range weights; ORT's advice is reduce_range (both get it)
    reduce_range = not any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))
    print(
        f"CPU int8 flags: {flags}; reduce_range={reduce_range}; "
        f"onnxruntime {ort.__version__}, torch {torch.__version__}"
    )
    print(
        f"{args.reps} reps, 2 intra-op threads, activation observer {args.observer}; "
        f"load average before {os.getloadavg()[0]:.2f}"
    )
    print(f"{'model':20} {'':5} {'quantize s':>10} {'SQNR dB':>8} {'size KB':>9} {'int8 prod':>9} {'latency ms':>10}")
    torch.manual_seed(0)
    wanted = set(args.models.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        if "cnn" in wanted:
            case("cnn", CNN(), lambda: torch.randn(8, 3, 64, 64), False, args, d, reduce_range)
        if "mobilenet" in wanted:
            mobile = MobileNetLike()
            with torch.no_grad():  # non-trivial batch-norm statistics
                for module in mobile.modules():
                    if isinstance(module, torch.nn.BatchNorm2d):
                        module.running_mean.uniform_(-0.5, 0.5)
                        module.running_var.uniform_(0.5, 2.0)
            case("mobilenet", mobile, lambda: torch.randn(8, 3, 64, 64), False, args, d, reduce_range)
        if "block" in wanted:
            block = Block()
            for dynamic in (False, True):
                case("block", block, lambda: torch.randn(8, 64, 128), dynamic, args, d, reduce_range)
        if "bert" in wanted:
            model = bert()
            if model is None:
                print("bert: skipped (transformers is not installed)")
            else:
                for dynamic in (False, True):
                    case("bert", model, lambda: torch.randint(0, 1000, (8, 64)), dynamic, args, d, reduce_range)
    print(f"load average after {os.getloadavg()[0]:.2f} (2 cores)")


if __name__ == "__main__":
    main()

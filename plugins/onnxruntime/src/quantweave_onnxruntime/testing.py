"""Reference models and the side-by-side with ONNX Runtime's own quantizer, for tests and benchmarks.

One home for what ``tests/onnxruntime`` and ``benchmarks/bench_onnxruntime.py`` both need:

- models: :class:`CNN` (the issue's: 3 convs, a residual add, pooling, a linear),
  :class:`MLP`, :class:`TokenMLP` (a token table before two linears), :class:`Block` (a
  pre-norm transformer encoder block), :class:`MobileNetLike`, :func:`bert` (transformers'
  ``BertModel`` from a config, nothing downloaded);
- ours: :func:`quantize` (torch.export, prepare, calibrate, convert, :func:`~quantweave_onnxruntime.to_onnx`);
- ORT's: :func:`ort_quantize_static` (``quantize_static``: QDQ, per-channel, the same
  calibration batches) and :func:`ort_quantize_dynamic`;
- measures: :func:`sqnr`, :func:`products` (int8 / float products in ORT's optimized graph),
  :func:`run`, :func:`output_step`, :func:`cpu_int8_flags` and :data:`REDUCE_RANGE`.

The models need only torch; the rest imports onnx / onnxruntime on first call (the ``runtime``
extra), transformers in :func:`bert`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import quantweave as qw

from ._export import int8_kernels, ort_session, to_onnx

__all__ = [
    "BENCH_MODELS",
    "CNN",
    "FLOAT_PRODUCTS",
    "INT8_PRODUCTS",
    "MLP",
    "REDUCE_RANGE",
    "Block",
    "MobileNetLike",
    "TokenMLP",
    "bert",
    "cpu_int8_flags",
    "ort_quantize_dynamic",
    "ort_quantize_static",
    "output_step",
    "products",
    "quantize",
    "run",
    "sqnr",
]

#: ORT ops that compute a product on int8 data / in float
INT8_PRODUCTS = (
    "QLinearConv",
    "QGemm",
    "QLinearMatMul",
    "MatMulInteger",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
)
FLOAT_PRODUCTS = ("Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul", "FusedMatMul", "MatMulNBits", "ConvTranspose")

_INT8_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8")


def cpu_int8_flags() -> tuple[str, ...]:
    """The CPU's flags that matter for int8 kernels (from /proc/cpuinfo; empty elsewhere)."""
    info = Path("/proc/cpuinfo")
    flags = set(info.read_text().split()) if info.exists() else set()
    return tuple(f for f in _INT8_FLAGS if f in flags)


#: CPUs without VNNI saturate u8 x s8 pair sums with full-range int8 weights: ORT recommends
#: reduce_range (7-bit weights) there; both quantizers get the same setting
REDUCE_RANGE = not any(f in cpu_int8_flags() for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


# -- models ----------------------------------------------------------------------------------------


class CNN(torch.nn.Module):
    """3 convs, a residual add, pooling, a linear (the issue's reference model)."""

    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.c2 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.c3 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c1(x))
        y = self.c3(F.relu(self.c2(x)))
        z = F.max_pool2d(F.relu(y + x), 2)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(z, 1), 1))


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 128)
        self.fc3 = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class TokenMLP(torch.nn.Module):
    """Token table -> linear -> relu -> linear on [batch, tokens, features] (3-D linears)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 64)
        self.fc1 = torch.nn.Linear(64, 64)
        self.fc2 = torch.nn.Linear(64, 100)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(self.emb(tokens))))


class Block(torch.nn.Module):
    """A pre-norm transformer encoder block: q / k / v / out projections, two attention
    matmuls, softmax, a GELU MLP (``mlp`` x ``d`` wide), residual adds."""

    def __init__(self, d: int = 32, heads: int = 2, mlp: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(3))
        self.out = torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, mlp * d), torch.nn.Linear(mlp * d, d)
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (p(h).reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for p in self.qkv)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (d // self.heads) ** -0.5
        attended = torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(attended)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


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
    """MobileNetV2-like: conv-bn-relu6 stem, 4 inverted residual blocks with depthwise convs,
    a 1x1 head, a linear; batch-norm statistics made non-trivial (seeded)."""

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
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, torch.nn.BatchNorm2d):
                    assert module.running_mean is not None and module.running_var is not None
                    module.running_mean.uniform_(-0.5, 0.5)
                    module.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def bert(
    layers: int = 2, hidden: int = 32, heads: int = 2, intermediate: int = 64, vocab: int = 100, positions: int = 32
) -> torch.nn.Module:
    """transformers' ``BertModel`` from a config (random init, nothing downloaded; eager
    attention: explicit matmuls, as SDPA is one op left float), returning the last hidden state."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=positions,
        attn_implementation="eager",
    )

    class Bert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertModel(config, add_pooling_layer=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).last_hidden_state

    return Bert()


# -- ours and ORT's --------------------------------------------------------------------------------


def quantize(
    model: torch.nn.Module,
    batches: Sequence[torch.Tensor],
    x: torch.Tensor,
    quantizer: qw.Quantizer,
    path: str | os.PathLike[str],
    qat: bool = False,
    dynamic_shapes: Any = None,
) -> tuple[torch.fx.GraphModule, Path]:
    """quantweave's path: torch.export, prepare, one forward per batch, convert, to_onnx.
    Returns the converted model and the ONNX file."""
    exported = torch.export.export(model, (x,), dynamic_shapes=dynamic_shapes).module()
    prepared = (qw.prepare_qat_pt2e if qat else qw.prepare_pt2e)(exported, quantizer)
    for batch in batches:
        prepared(batch)
    converted = qw.convert_pt2e(prepared)
    return converted, to_onnx(converted, (x,), path, dynamic_shapes=dynamic_shapes)


def _input_name(path: Path) -> str:
    import onnxruntime as ort

    name: str = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()[0].name
    return name


def _reader(name: str, batches: Sequence[torch.Tensor]) -> Any:
    from onnxruntime import quantization

    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{name: b.numpy()} for b in batches])

        def get_next(self) -> dict[str, Any] | None:
            return next(self.feeds, None)

    return Reader()


def _float_onnx(model: torch.nn.Module | str | os.PathLike[str], x: torch.Tensor, d: Path, name: str) -> Path:
    if isinstance(model, torch.nn.Module):
        return to_onnx(model, (x,), d / f"{name}_float.onnx")
    return Path(model)


def ort_quantize_static(
    model: torch.nn.Module | str | os.PathLike[str],
    batches: Sequence[torch.Tensor],
    x: torch.Tensor,
    directory: str | os.PathLike[str],
    activation_type: str = "uint8",
    symmetric_activations: bool = False,
    pre_process: bool = False,
    reduce_range: bool = REDUCE_RANGE,
    name: str = "ort",
) -> tuple[Path, Path]:
    """ORT's own path on the same float model and calibration batches: the model exported to
    ONNX with the same exporter (``model`` may also be the path of that float ONNX file), then
    (with ``pre_process``: ``quant_pre_process`` and) ``quantize_static``: QDQ, per-channel int8
    weights, ``activation_type`` activations, MinMax calibration. Returns (float path, quantized
    path)."""
    from onnxruntime import quantization
    from onnxruntime.quantization.shape_inference import quant_pre_process

    d = Path(directory)
    float_path = _float_onnx(model, x, d, name)
    source = float_path
    if pre_process:
        source = d / f"{name}_pre.onnx"
        quant_pre_process(str(float_path), str(source), skip_symbolic_shape=True)
    out = d / f"{name}_qdq.onnx"
    types = {"uint8": quantization.QuantType.QUInt8, "int8": quantization.QuantType.QInt8}
    quantization.quantize_static(
        str(source),
        str(out),
        _reader(_input_name(float_path), batches),
        quant_format=quantization.QuantFormat.QDQ,
        per_channel=True,
        reduce_range=reduce_range,
        activation_type=types[activation_type],
        weight_type=quantization.QuantType.QInt8,
        extra_options={"ActivationSymmetric": True} if symmetric_activations else None,
    )
    return float_path, out


def ort_quantize_dynamic(
    model: torch.nn.Module | str | os.PathLike[str],
    x: torch.Tensor,
    directory: str | os.PathLike[str],
    reduce_range: bool = REDUCE_RANGE,
    name: str = "ort",
) -> tuple[Path, Path]:
    """ORT's ``quantize_dynamic`` (per-channel int8 weights) on the float model exported with
    the same exporter (or the path of that float ONNX file). Returns (float path, quantized path)."""
    from onnxruntime import quantization

    d = Path(directory)
    float_path = _float_onnx(model, x, d, name)
    out = d / f"{name}_dynamic.onnx"
    quantization.quantize_dynamic(
        str(float_path),
        str(out),
        per_channel=True,
        reduce_range=reduce_range,
        weight_type=quantization.QuantType.QInt8,
    )
    return float_path, out


# -- measures --------------------------------------------------------------------------------------


def run(path: str | os.PathLike[str], *inputs: torch.Tensor, threads: int = 1) -> list[Any]:
    """The outputs of the ONNX model at ``path`` on ORT's CPU provider."""
    session = ort_session(path, intra_op_threads=threads)
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)}
    outputs: list[Any] = session.run(None, feeds)
    return outputs


def sqnr(expected: Any, got: Any) -> float:
    """Signal to quantization noise ratio of ``got`` against ``expected``, in dB."""
    import numpy as np

    expected, got = np.asarray(expected, dtype=np.float64), np.asarray(got, dtype=np.float64)
    noise = max(float(((expected - got) ** 2).mean()), 1e-30)
    return float(10 * np.log10(float((expected**2).mean()) / noise))


def output_step(converted: torch.fx.GraphModule) -> float:
    """The scale of the converted model's last per-tensor dequantize (its output's quantization step)."""
    last = next(n for n in reversed(converted.graph.nodes) if "dequantize_per_tensor" in str(n.target))
    return float(last.args[1])


def products(path: str | os.PathLike[str] | dict[str, int]) -> tuple[int, int]:
    """(int8 products, float products) in ORT's optimized graph of the model at ``path`` (or
    in an :func:`~quantweave_onnxruntime.int8_kernels` count)."""
    ops = path if isinstance(path, dict) else int8_kernels(path)
    return sum(ops.get(op, 0) for op in INT8_PRODUCTS), sum(ops.get(op, 0) for op in FLOAT_PRODUCTS)


#: model name -> (factory, input maker) for the benchmark's cases at benchmark size
BENCH_MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], torch.Tensor]]] = {
    "cnn": (lambda: CNN(channels=32), lambda: torch.randn(8, 3, 64, 64)),
    "mobilenet": (MobileNetLike, lambda: torch.randn(8, 3, 64, 64)),
    "block": (lambda: Block(d=128, heads=4, mlp=4), lambda: torch.randn(8, 64, 128)),
    "bert": (
        lambda: bert(layers=4, hidden=128, heads=4, intermediate=512, vocab=1000, positions=128),
        lambda: torch.randint(0, 1000, (8, 64)),
    ),
}

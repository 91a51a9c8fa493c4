"""A real client: quantweave-litert's models converted by litert-torch 0.10.0 and run by the
LiteRT interpreter (``ai_edge_litert``) — tox env ``litert``.

A CNN and an MLP, quantized by ``LiteRTQuantizer`` (static) and converted with
``to_tflite`` (``convert_pt2e(..., fold_quantize=False)`` then ``litert_torch.convert``):

- the .tflite is integer end to end: every tensor of every operator is INT8 (INT32 for
  biases and shape operands), inputs and outputs included, and no DEQUANTIZE is left;
- every declared static pattern is found in the op list as the int8 operator LiteRT runs
  (conv2d + relu as CONV_2D with a fused RELU, cat as a CONCATENATION whose inputs and
  output have one set of qparams, sigmoid / softmax with scale 1/256 and zero point -128,
  pooling and reshapes keeping their input's qparams ...), weights per-channel int8 with
  zero points 0, biases int32;
- the interpreter's outputs (with its default XNNPACK delegate, and with the builtin
  kernels only) are within one quantization step of the converted PyTorch model's on
  every element of 20 inputs;
- the dynamic-range MLP (``LiteRTQuantizer(is_dynamic=True)``) becomes FULLY_CONNECTED ops
  with float inputs and outputs and int8 per-channel weights (LiteRT quantizes the
  activations at run time, so the bound there is a signal-to-noise ratio: > 40 dB).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quantweave.testing.inspect import sqnr

pytestmark = pytest.mark.litert
pytest.importorskip("litert_torch", reason="needs litert-torch 0.10.0 (tox -e litert)")

from ai_edge_litert.interpreter import Interpreter, OpResolverType  # noqa: E402
from quantweave_litert import LiteRTQuantizer, tflite_ops, to_tflite  # noqa: E402
from quantweave_litert.quantizer import CAPABILITIES  # noqa: E402
from quantweave_litert.tflite import quantize  # noqa: E402

FIXED = ((1 / 256,), (-128,))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(16 * 4, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = F.relu(self.conv1(x))  # conv2d_relu
        b = F.relu(self.conv2(a) + a)  # conv2d, add_relu
        c = torch.cat([b, self.conv3(b)], 1)  # conv2d, cat
        d = F.max_pool2d(c, 2)  # max_pool2d
        e = d * torch.sigmoid(d)  # sigmoid, mul
        f = F.adaptive_avg_pool2d(e, 2).flatten(1)  # adaptive_avg_pool2d, flatten
        return torch.softmax(self.fc(f), -1), f  # linear, softmax


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.fc1(x))  # linear_relu
        g = self.fc2(h) + h  # linear, add
        t = g * torch.sigmoid(g)  # sigmoid, mul
        u = self.fc3(t).view(4, 2, 4)  # linear, view
        return torch.softmax(u, -1).reshape(4, 8), g  # softmax, reshape


MODELS = {"cnn": (CNN, (1, 3, 16, 16)), "mlp": (MLP, (4, 16))}

#: declared pattern -> how LiteRT runs it: (operator names, fused activation (None: any), check)
PATTERNS = {
    "conv2d": ({"CONV_2D"}, "NONE", "weighted"),
    "conv2d_relu": ({"CONV_2D"}, "RELU", "weighted"),
    "linear": ({"FULLY_CONNECTED"}, "NONE", "weighted"),
    "linear_relu": ({"FULLY_CONNECTED"}, "RELU", "weighted"),
    "add": ({"ADD"}, "NONE", None),
    "add_relu": ({"ADD"}, "RELU", None),
    "mul": ({"MUL"}, "NONE", None),
    "cat": ({"CONCATENATION"}, "NONE", "all_shared"),
    "sigmoid": ({"LOGISTIC"}, None, "fixed"),
    "softmax": ({"SOFTMAX"}, None, "fixed"),
    "max_pool2d": ({"MAX_POOL_2D"}, "NONE", "shared"),
    "adaptive_avg_pool2d": ({"AVERAGE_POOL_2D", "MEAN"}, None, "shared"),
    "flatten": ({"RESHAPE"}, None, "shared"),
    "view": ({"RESHAPE"}, None, "shared"),
    "reshape": ({"RESHAPE"}, None, "shared"),
}
#: which model carries each declared static pattern
IN_MODEL = {
    "cnn": ("conv2d", "conv2d_relu", "add_relu", "cat", "max_pool2d", "sigmoid", "mul", "adaptive_avg_pool2d"),
    "mlp": ("linear_relu", "linear", "add", "sigmoid", "mul", "view", "softmax", "reshape"),
}
IN_MODEL["cnn"] += ("flatten", "linear", "softmax")


def _calibration(shape: tuple[int, ...]) -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(*shape, generator=gen),) for _ in range(16)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache: dict[tuple[str, bool], tuple[torch.fx.GraphModule, bytes]] = {}

    def get(name: str, dynamic: bool = False) -> tuple[torch.fx.GraphModule, bytes]:
        if (name, dynamic) not in cache:
            cls, shape = MODELS[name]
            torch.manual_seed(0)
            model = cls().eval()
            example = (torch.randn(*shape),)
            converted = quantize(model, example, LiteRTQuantizer(is_dynamic=dynamic), _calibration(shape))
            path = tmp_path_factory.mktemp("tflite") / f"{name}{'_dynamic' if dynamic else ''}.tflite"
            edge = to_tflite(converted, example, path)
            content = edge.model_content()
            assert path.read_bytes() == content
            cache[(name, dynamic)] = (converted, content)
        return cache[(name, dynamic)]

    return get


def test_the_two_models_carry_every_declared_static_pattern():
    declared = {c.pattern for c in CAPABILITIES if c.mode.value == "static"}
    assert set(PATTERNS) == declared
    assert set(IN_MODEL["cnn"]) | set(IN_MODEL["mlp"]) == declared


@pytest.mark.parametrize("name", MODELS)
def test_the_static_tflite_is_integer_end_to_end(name, built):
    _, content = built(name)
    ops = tflite_ops(content)
    assert ops and not [op.name for op in ops if op.name in ("DEQUANTIZE", "QUANTIZE")]
    for op in ops:
        for tensor in (*op.inputs, *op.outputs):
            assert tensor.dtype in ("INT8", "INT32"), f"{op.name}: {tensor.name} is {tensor.dtype}"
    interpreter = Interpreter(model_content=content)
    details = [*interpreter.get_input_details(), *interpreter.get_output_details()]
    assert {d["dtype"] for d in details} == {np.int8}


CASES = [(name, pattern) for name, patterns in IN_MODEL.items() for pattern in dict.fromkeys(patterns)]


@pytest.mark.parametrize(("name", "pattern"), CASES)
def test_each_declared_pattern_is_an_int8_litert_op(name, pattern, built):
    _, content = built(name)
    names, activation, check = PATTERNS[pattern]
    candidates = [
        op
        for op in tflite_ops(content)
        if op.name in names and (activation is None or op.fused_activation == activation)
    ]
    assert candidates, (
        f"no {'/'.join(names)} with fused activation {activation} in {[op.name for op in tflite_ops(content)]}"
    )
    found = []
    for op in candidates:
        x, out = op.inputs[0], op.outputs[0]
        if x.dtype != "INT8" or out.dtype != "INT8":
            continue
        if check == "weighted":
            weight, bias = op.inputs[1], op.inputs[2]
            channels = weight.shape[0]
            ok = (
                weight.dtype == "INT8"
                and len(weight.scale) == channels
                and set(weight.zero_point) == {0}
                and bias.dtype == "INT32"
            )
        elif check == "fixed":
            ok = (out.scale, out.zero_point) == FIXED
        elif check == "shared":
            ok = (out.scale, out.zero_point) == (x.scale, x.zero_point)
        elif check == "all_shared":
            ok = len({(t.scale, t.zero_point) for t in (*op.inputs, out)}) == 1
        else:
            ok = all(t.dtype == "INT8" for t in op.inputs)
        found.append(ok)
    assert any(found), f"{pattern}: no int8 {'/'.join(names)} as LiteRT's scheme requires"


def _quantize(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    return np.clip(np.round(x / scale) + zero_point, -128, 127).astype(np.int8)


@pytest.mark.parametrize("resolver", ["default", "builtin"])
@pytest.mark.parametrize("name", MODELS)
def test_the_interpreter_matches_the_converted_model_within_one_step(name, resolver, built):
    converted, content = built(name)
    kwargs = (
        {}
        if resolver == "default"
        else {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    )
    runner = Interpreter(model_content=content, **kwargs).get_signature_runner()
    ((input_name, input_detail),) = runner.get_input_details().items()
    in_scale, in_zp = input_detail["quantization"]
    outputs = runner.get_output_details()
    gen = torch.Generator().manual_seed(2)
    worst, off, total = 0, 0, 0
    for _ in range(20):
        x = torch.randn(*MODELS[name][1], generator=gen)
        x_q = _quantize(x.numpy(), in_scale, in_zp)
        x_exact = torch.from_numpy((x_q.astype(np.float32) - in_zp) * in_scale)  # what both models see
        reference = converted(x_exact)
        got = runner(**{input_name: x_q})
        for i, ref in enumerate(reference):
            scale, zp = outputs[f"output_{i}"]["quantization"]
            ref_q = np.round(ref.detach().numpy() / scale) + zp
            steps = np.abs(got[f"output_{i}"].astype(np.int32) - ref_q)
            worst, off, total = max(worst, int(steps.max())), off + int((steps > 0).sum()), total + steps.size
    print(f"{name} [{resolver}]: max {worst} step(s), {off}/{total} elements off by one")
    assert worst <= 1, f"{name}: {off}/{total} elements differ, up to {worst} steps"


def test_the_dynamic_range_mlp_runs_float_activations_on_int8_weights(built):
    converted, content = built("mlp", dynamic=True)
    ops = tflite_ops(content)
    fcs = [op for op in ops if op.name == "FULLY_CONNECTED"]
    assert len(fcs) == 3
    for op in fcs:
        x, weight, out = op.inputs[0], op.inputs[1], op.outputs[0]
        assert (x.dtype, weight.dtype, out.dtype) == ("FLOAT32", "INT8", "FLOAT32")
        assert len(weight.scale) == weight.shape[0] and set(weight.zero_point) == {0}
    runner = Interpreter(model_content=content).get_signature_runner()
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        x = torch.randn(4, 16, generator=gen)
        got = runner(args_0=x.numpy())
        for i, ref in enumerate(converted(x)):
            value = sqnr(ref, torch.from_numpy(got[f"output_{i}"]))
            print(f"mlp dynamic output_{i}: SQNR {value:.1f} dB")
            assert value > 40  # measured 45.9 to 62.8 dB


def test_litert_torch_rejects_folded_int8_weights():
    # why to_tflite converts with fold_quantize=False (measured with litert-torch 0.10.0)
    import litert_torch
    from litert_torch.quantize.quant_config import QuantConfig

    import quantweave as qw

    model, x = MLP().eval(), torch.randn(4, 16)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), LiteRTQuantizer())
    prepared(x)
    folded = qw.convert_pt2e(prepared)
    with pytest.raises(ValueError, match=r"uniform_dequantize.*must be .*quantized"):
        litert_torch.convert(folded, (x,), quant_config=QuantConfig(pt2e_quantizer=LiteRTQuantizer()))


def test_to_tflite_quantizes_a_float_model_itself(tmp_path):
    torch.manual_seed(0)
    model, shape = MLP().eval(), MODELS["mlp"][1]
    path = tmp_path / "mlp.tflite"
    edge = to_tflite(model, (torch.randn(*shape),), path, quantizer=LiteRTQuantizer(), calibration=_calibration(shape))
    assert path.stat().st_size == len(edge.model_content())
    assert {op.name for op in tflite_ops(edge.model_content())} >= {"FULLY_CONNECTED", "SOFTMAX", "LOGISTIC"}

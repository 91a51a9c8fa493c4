"""Clips (relu6 / hardtanh) that the next QuantizeLinear makes redundant are left out of the
ONNX file, as ORT's own quantizer leaves them out (tox env ``onnxruntime``): exactly the
Clips that change no quantized value (checked on ORT over a sweep of inputs), and a
MobileNet-like model's file then has none while ORT runs every conv as a QLinearConv, and
with MinMax calibration its qparams and int8 weights are those of ORT's quantize_static."""

import numpy as np
import pytest
import torch

from quantweave_onnxruntime import ORTQuantizer, int8_kernels
from quantweave_onnxruntime._onnx_cleanup import drop_redundant_activations, redundant_clip
from quantweave_onnxruntime.testing import (
    REDUCE_RANGE,
    InvertedResidual,
    _conv_bn,
    output_step,
    products,
    quantize,
    run,
)

onnx = pytest.importorskip("onnx", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")
pytest.importorskip("onnxruntime", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402  (after the skip)

from quantweave_onnxruntime.testing import ort_quantize_static  # noqa: E402  (imports onnxruntime)

pytestmark = pytest.mark.onnxruntime

UINT8, INT8 = TensorProto.UINT8, TensorProto.INT8


def test_a_clip_is_redundant_only_where_the_quantize_saturates_inside_its_bounds():
    assert redundant_clip(0.0, 6.0, 6.0 / 255, 0, UINT8)  # relu6 -> uint8 observed up to 6
    assert redundant_clip(0.0, 6.0, 4.0 / 255, 0, UINT8)  # a narrower range saturates earlier
    assert redundant_clip(-1.0, 1.0, 1.0 / 128, 0, INT8)  # hardtanh -> int8 [-128, 127]
    assert not redundant_clip(-1.0, 1.0, 1.0 / 127, 0, INT8)  # -128 / 127 is below -1
    assert redundant_clip(None, 6.0, 6.0 / 255, 0, UINT8)  # an omitted bound bounds nothing
    assert not redundant_clip(0.0, 6.0, 8.0 / 255, 0, UINT8)  # the quantize reaches past 6
    assert not redundant_clip(0.0, 6.0, 6.0 / 255, 10, UINT8)  # ... and below 0
    assert not redundant_clip(1.0, 6.0, 6.0 / 255, 0, UINT8)  # the clip raises what the quantize keeps
    assert not redundant_clip(0.0, 6.0, 6.0 / 255, 0, TensorProto.FLOAT)  # not an integer quantize
    assert not redundant_clip(0.0, 6.0, 0.0, 0, UINT8)


def _clip_graph(path, scale, zero_point, dtype=UINT8, lo=0.0, hi=6.0, extra_user=False):
    """x -> Clip(lo, hi) -> QuantizeLinear(scale, zero_point) -> y (and the Clip's output as a
    second graph output with ``extra_user``)."""
    np_dtype = {UINT8: np.uint8, INT8: np.int8}[dtype]
    initializers = [
        numpy_helper.from_array(np.array(lo, np.float32), "lo"),
        numpy_helper.from_array(np.array(hi, np.float32), "hi"),
        numpy_helper.from_array(np.array(scale, np.float32), "scale"),
        numpy_helper.from_array(np.array(zero_point, np_dtype), "zp"),
    ]
    nodes = [
        helper.make_node("Clip", ["x", "lo", "hi"], ["clipped"], name="clip"),
        helper.make_node("QuantizeLinear", ["clipped", "scale", "zp"], ["y"], name="q"),
    ]
    outputs = [helper.make_tensor_value_info("y", dtype, [64])]
    if extra_user:
        outputs.append(helper.make_tensor_value_info("clipped", TensorProto.FLOAT, [64]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])], outputs, initializers
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def _ops(path):
    return [n.op_type for n in onnx.load(str(path)).graph.node]


@pytest.mark.parametrize(
    "scale, zero_point, dtype, lo, hi",
    [(6.0 / 255, 0, UINT8, 0.0, 6.0), (4.0 / 255, 0, UINT8, 0.0, 6.0), (1.0 / 128, 0, INT8, -1.0, 1.0)],
)
def test_a_redundant_clip_is_dropped_and_ort_quantizes_every_input_as_before(
    tmp_path, scale, zero_point, dtype, lo, hi
):
    path = _clip_graph(tmp_path / "clip.onnx", scale, zero_point, dtype, lo, hi)
    # a sweep through both bounds, their neighbourhood and far outside
    x = np.concatenate([np.linspace(lo - 2, hi + 2, 48), [lo, hi, np.nextafter(hi, 9), -1e9, 1e9]]).astype(np.float32)
    x = np.concatenate([x, np.zeros(64 - x.size, np.float32)])
    (before,) = run(path, torch.from_numpy(x))
    assert drop_redundant_activations(path) == 1
    assert _ops(path) == ["QuantizeLinear"]
    assert {t.name for t in onnx.load(str(path)).graph.initializer} == {"scale", "zp"}  # the bounds went too
    (after,) = run(path, torch.from_numpy(x))
    np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scale": 8.0 / 255, "zero_point": 0},
        {"scale": 6.0 / 255, "zero_point": 12},
        {"lo": 1.0, "scale": 6.0 / 255, "zero_point": 0},
    ],
    ids=["quantize-reaches-past-hi", "quantize-reaches-below-lo", "clip-raises-lo"],
)
def test_a_clip_that_changes_quantized_values_stays(tmp_path, kwargs):
    path = _clip_graph(tmp_path / "clip.onnx", **kwargs)
    assert drop_redundant_activations(path) == 0
    assert _ops(path) == ["Clip", "QuantizeLinear"]


def test_a_clip_whose_output_is_also_read_elsewhere_stays(tmp_path):
    path = _clip_graph(tmp_path / "clip.onnx", 6.0 / 255, 0, extra_user=True)
    assert drop_redundant_activations(path) == 0
    assert _ops(path) == ["Clip", "QuantizeLinear"]


class _MiniMobileNet(torch.nn.Module):
    """MobileNetV2's units, once each (small, for a short export): conv-bn-relu6 stem, an
    inverted residual block (expand, depthwise, project; 3 relu6, a residual add), pool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(_conv_bn(3, 8, 3, 2), InvertedResidual(8, 8, 1, expand=2))
        self.fc = torch.nn.Linear(8, 10)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, torch.nn.BatchNorm2d):
                    module.running_mean.uniform_(-0.5, 0.5)
                    module.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.body(x), 1), 1))


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory):
    """Ours with the default observer (MinMax, ORT's calibration) and ORT's quantize_static on
    the same float model and batches."""
    tmp = tmp_path_factory.mktemp("mobilenet")
    torch.manual_seed(0)
    model = _MiniMobileNet().eval()
    batches = [torch.randn(2, 3, 32, 32) for _ in range(2)]
    x = torch.randn(2, 3, 32, 32)
    quantizer = ORTQuantizer(reduce_range=REDUCE_RANGE)
    assert quantizer.observer == "minmax"
    converted, path = quantize(model, batches, x, quantizer, tmp / "m.onnx")
    _, theirs = ort_quantize_static(model, batches, x, tmp, pre_process=True)
    return converted, path, x, theirs


def test_mobilenet_like_file_has_no_clip_and_ort_runs_every_conv_as_qlinearconv(mobilenet):
    converted, path, x, _ = mobilenet
    # the converted model keeps its 3 relu6 (hardtanh); the file keeps none of them
    assert sum(n.target == torch.ops.aten.hardtanh.default for n in converted.graph.nodes) == 3
    assert "Clip" not in _ops(path)
    ops = int8_kernels(path)
    assert ops.get("QLinearConv") == 4 and ops.get("QGemm") == 1 and products(ops) == (5, 0), ops
    assert ops.get("QLinearAdd") == 1, ops
    assert "Clip" not in ops and "Relu" not in ops, ops
    (got,) = run(path, x)
    expected = converted(x).detach().numpy()
    assert np.abs(got - expected).max() <= output_step(converted) + 1e-6


def _units(path):
    """Per Conv / Gemm in graph order: its int8 weight, weight scales, input (scale, zero
    point) and the (scale, zero point) of the QuantizeLinear that reads its output."""
    graph = onnx.load(str(path)).graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    units = []
    for node in graph.node:
        if node.op_type not in ("Conv", "Gemm"):
            continue
        x, w = producer[node.input[0]], producer[node.input[1]]
        (q,) = [r for r in readers[node.output[0]] if r.op_type == "QuantizeLinear"]
        qparams = [(float(values[n.input[1]]), int(values[n.input[2]])) for n in (x, q)]
        units.append((values[w.input[0]], values[w.input[1]], *qparams))
    return units


def test_by_default_every_conv_and_the_linear_get_quantize_statics_qparams_and_weights(mobilenet):
    """The recipe is ORT's: the same int8 weights and weight scales, and, with the default
    MinMax observer, the same activation scales and zero points on every conv / gemm."""
    _, ours, _, theirs = mobilenet
    mine, ort_units = _units(ours), _units(theirs)
    assert len(mine) == len(ort_units) == 5
    for i, (a, b) in enumerate(zip(mine, ort_units, strict=True)):
        np.testing.assert_array_equal(a[0], b[0], err_msg=f"unit {i}: int8 weight")
        np.testing.assert_allclose(a[1], b[1], rtol=1e-6, err_msg=f"unit {i}: weight scales")
        for j in (2, 3):
            assert a[j][1] == b[j][1] and a[j][0] == pytest.approx(b[j][0], rel=1e-6), (i, j, a[j], b[j])

"""quantweave-onnxruntime on ONNX Runtime (tox env ``onnxruntime``): the converted model exported
to ONNX QDQ, the int8 kernels ORT forms from it, its outputs against the converted model, and
its accuracy against ORT's own ``quantize_static`` on the same float model and calibration data."""

import numpy as np
import pytest
import torch

import quantweave as qw
from quantweave_onnxruntime import ORTQuantizer, export_onnx, int8_kernels, ort_session
from quantweave_onnxruntime.testing import CNN, MLP, REDUCE_RANGE, TokenMLP, output_step, products, quantize, sqnr
from tests.helpers import ort_cnn

ort = pytest.importorskip("onnxruntime", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")
quantization = pytest.importorskip("onnxruntime.quantization", reason="needs onnxruntime (tox -e onnxruntime)")
from quantweave_onnxruntime.testing import ort_quantize_static  # noqa: E402  (after the skip: imports onnxruntime)

pytestmark = pytest.mark.onnxruntime


def _mlp():
    torch.manual_seed(0)
    model = MLP().eval()
    return model, [torch.randn(8, 64) for _ in range(8)], torch.randn(8, 64)


def _ours(model, batches, x, path):
    return quantize(model, batches, x, ORTQuantizer(reduce_range=REDUCE_RANGE), path)


def _run(path, x):
    session = ort_session(path, intra_op_threads=1)
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


_output_step, _sqnr = output_step, sqnr


def _ort_quantize_static(model, batches, x, tmp_path, activation_type="uint8"):
    return ort_quantize_static(model, batches, x, tmp_path, activation_type=activation_type)


@pytest.fixture(scope="module")
def cnn_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cnn")
    model, batches, x = ort_cnn()
    converted, ours = _ours(model, batches, x, tmp / "ours.onnx")
    float_path, theirs = _ort_quantize_static(model, batches, x, tmp)
    return {"model": model, "x": x, "converted": converted, "ours": ours, "ort": theirs, "float": float_path}


def test_every_conv_and_the_linear_run_as_int8_kernels(cnn_runs):
    ops = int8_kernels(cnn_runs["ours"])
    assert ops.get("QLinearConv") == 3 and "Conv" not in ops
    assert ops.get("QGemm", 0) + ops.get("MatMulInteger", 0) + ops.get("QLinearMatMul", 0) == 1
    assert "Gemm" not in ops and "MatMul" not in ops
    assert ops.get("QLinearAdd") == 1  # the residual add


def test_int8_weights_are_int8_initializers(cnn_runs):
    import onnx

    model = onnx.load(str(cnn_runs["ours"]))
    int8 = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert len(int8) >= 4  # the three conv weights and the linear weight
    assert {n.op_type for n in model.graph.node} >= {"QuantizeLinear", "DequantizeLinear"}


def test_ort_outputs_are_within_a_few_steps_of_the_converted_model(cnn_runs):
    x = cnn_runs["x"]
    got = _run(cnn_runs["ours"], x)
    expected = cnn_runs["converted"](x).detach().numpy()
    assert np.abs(got - expected).max() <= 3 * _output_step(cnn_runs["converted"]) + 1e-6


def test_sqnr_is_at_least_ort_quantize_static(cnn_runs):
    x = cnn_runs["x"]
    reference = cnn_runs["model"](x).detach().numpy()
    ours, theirs = _sqnr(reference, _run(cnn_runs["ours"], x)), _sqnr(reference, _run(cnn_runs["ort"], x))
    assert ours >= theirs - 0.3, (ours, theirs)
    assert int8_kernels(cnn_runs["ort"]).get("QLinearConv") == 3  # ORT's own model: the same kernels


def test_mlp_linears_run_as_int8_and_match(tmp_path):
    model, batches, x = _mlp()
    converted, path = _ours(model, batches, x, tmp_path / "mlp.onnx")
    ops = int8_kernels(path)
    assert ops.get("QGemm", 0) + ops.get("MatMulInteger", 0) + ops.get("QLinearMatMul", 0) == 3, ops
    assert "Gemm" not in ops and "MatMul" not in ops
    got, expected = _run(path, x), converted(x).detach().numpy()
    reference = model(x).detach().numpy()
    assert _sqnr(reference, got) > 25
    assert _sqnr(expected, got) > 35  # ORT computes what the converted model computes


def test_export_reports_a_missing_directory(tmp_path, cnn_runs):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        export_onnx(cnn_runs["converted"], (cnn_runs["x"],), tmp_path / "nowhere" / "m.onnx")
    with pytest.raises(FileNotFoundError, match=r"absent\.onnx"):
        ort_session(tmp_path / "absent.onnx")


def test_int8_activations_form_the_kernels_ort_forms_for_its_own_qint8_model(tmp_path):
    model, batches, x = ort_cnn()
    quantizer = ORTQuantizer(activation_dtype="int8", reduce_range=REDUCE_RANGE)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    for batch in batches:
        prepared(batch)
    converted = qw.convert_pt2e(prepared)
    path = export_onnx(converted, (x,), tmp_path / "int8.onnx")
    _, theirs = _ort_quantize_static(model, batches, x, tmp_path, "int8")
    ours_ops, their_ops = int8_kernels(path), int8_kernels(theirs)
    for op in ("QLinearConv", "QGemm", "QLinearAdd", "Conv", "Gemm", "Relu"):
        assert ours_ops.get(op) == their_ops.get(op), (op, ours_ops, their_ops)
    reference = model(x).detach().numpy()
    assert _sqnr(reference, _run(path, x)) >= _sqnr(reference, _run(theirs, x)) - 0.3
    assert _sqnr(converted(x).detach().numpy(), _run(path, x)) > 35


def test_a_dynamic_batch_exports_and_runs_at_another_batch_size(tmp_path):
    model, batches, x = _mlp()
    shapes = {"x": {0: torch.export.Dim("batch")}}
    exported = torch.export.export(model, (x,), dynamic_shapes=shapes).module()
    prepared = qw.prepare_pt2e(exported, ORTQuantizer(reduce_range=REDUCE_RANGE))
    for batch in batches:
        prepared(batch)
    converted = qw.convert_pt2e(prepared)
    path = export_onnx(converted, (x,), tmp_path / "dynamic.onnx", dynamic_shapes=shapes)
    other = torch.randn(3, 64)
    got = _run(path, other)
    assert got.shape == (3, 10)
    assert _sqnr(converted(other).detach().numpy(), got) > 35


def test_composed_with_the_embedding_plugin_token_tables_export_and_3d_linears_are_int8(tmp_path):
    from quantweave_embedding import EmbeddingQuantizer

    torch.manual_seed(0)
    model, tokens = TokenMLP().eval(), torch.randint(0, 100, (4, 16))
    composed = qw.ComposableQuantizer([EmbeddingQuantizer(), ORTQuantizer(reduce_range=REDUCE_RANGE)])
    prepared = qw.prepare_pt2e(torch.export.export(model, (tokens,)).module(), composed)
    prepared(tokens)
    converted = qw.convert_pt2e(prepared)
    path = export_onnx(converted, (tokens,), tmp_path / "tokens.onnx")
    import onnx

    onnx_model = onnx.load(str(path))
    eight_bit = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
    int8 = {t.name for t in onnx_model.graph.initializer if t.data_type in eight_bit}
    gather = next(n for n in onnx_model.graph.node if n.op_type == "Gather")
    table = next(n for n in onnx_model.graph.node if n.output[0] == gather.input[0])
    assert table.op_type == "DequantizeLinear" and table.input[0] in int8  # the table is stored in 8 bits (uint8 rows)
    assert "Relu" not in {n.op_type for n in onnx_model.graph.node}  # folded into the QuantizeLinear
    ops = int8_kernels(path)
    assert ops.get("QGemm", 0) + ops.get("MatMulInteger", 0) + ops.get("QLinearMatMul", 0) == 2, ops
    session = ort_session(path, intra_op_threads=1)
    got = session.run(None, {session.get_inputs()[0].name: tokens.numpy()})[0]
    assert np.abs(got - converted(tokens).detach().numpy()).max() <= 3 * _output_step(converted) + 1e-6


def _int32_bias_users(path):
    """Op type of each consumer of a DequantizeLinear whose input is an int32 initializer, with
    that DequantizeLinear's zero points."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    tensors = {t.name: t for t in graph.initializer}
    tensors.update({n.output[0]: n.attribute[0].t for n in graph.node if n.op_type == "Constant" and n.attribute})
    found = []
    for node in graph.node:
        source = tensors.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if source is None or source.data_type != onnx.TensorProto.INT32:
            continue
        users = [u.op_type for u in graph.node if node.output[0] in u.input]
        zero_point = numpy_helper.to_array(tensors[node.input[2]]) if len(node.input) > 2 else np.zeros(1)
        found.append((tuple(users), zero_point))
    return found


def test_int32_biases_are_where_quantize_static_writes_them_and_ort_still_fuses(cnn_runs):
    ours, theirs = _int32_bias_users(cnn_runs["ours"]), _int32_bias_users(cnn_runs["ort"])
    assert sorted(u for u, _ in ours) == sorted(u for u, _ in theirs) == [("Conv",)] * 3 + [("Gemm",)]
    assert all(not zero_point.any() for _, zero_point in ours)
    ops = int8_kernels(cnn_runs["ours"])
    assert ops.get("QLinearConv") == 3 and ops.get("QGemm") == 1 and "Conv" not in ops and "Gemm" not in ops
    # the converted model computes with the same int32 bias: ORT's output within one step of it
    x = cnn_runs["x"]
    got, expected = _run(cnn_runs["ours"], x), cnn_runs["converted"](x).detach().numpy()
    assert np.abs(got - expected).max() <= _output_step(cnn_runs["converted"]) + 1e-6


def test_a_module_left_float_by_its_config_runs_float_and_the_rest_int8(tmp_path):
    from quantweave_onnxruntime import ORTConfig

    torch.manual_seed(0)
    model, x = CNN().eval(), torch.randn(2, 3, 16, 16)
    quantizer = ORTQuantizer(reduce_range=REDUCE_RANGE).set_module_name("fc", None)
    quantizer.set_module_name("c3", ORTConfig(per_channel=False, reduce_range=REDUCE_RANGE))
    converted, path = quantize(model, [torch.randn(2, 3, 16, 16) for _ in range(2)], x, quantizer, tmp_path / "m.onnx")
    ops = int8_kernels(path)
    assert ops.get("QLinearConv") == 3 and "QGemm" not in ops and products(ops) == (3, 1), ops  # fc: a float gemm
    assert sqnr(converted(x).detach().numpy(), _run(path, x)) > 35

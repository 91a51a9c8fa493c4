"""quantweave-onnxruntime's dynamic and QAT modes and its split / resize / sigmoid / softmax
patterns on ONNX Runtime (tox env ``onnxruntime``): the int8 kernels ORT forms, outputs against
the converted model, and accuracy against ORT's own ``quantize_static`` / ``quantize_dynamic`` on
the same float model (a transformer block, a MobileNet-like CNN, BERT from a config)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import quantweave as qw
from quantweave_onnxruntime import ORTQuantizer, int8_kernels, ort_session, to_onnx
from quantweave_onnxruntime.testing import REDUCE_RANGE, Block, output_step, products, quantize, run, sqnr
from tests.helpers import ort_cnn

ort = pytest.importorskip("onnxruntime", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")
quantization = pytest.importorskip("onnxruntime.quantization", reason="needs onnxruntime (tox -e onnxruntime)")
from quantweave_onnxruntime.testing import ort_quantize_dynamic, ort_quantize_static  # noqa: E402

pytestmark = pytest.mark.onnxruntime

_output_step, _sqnr, _quantize, _run = output_step, sqnr, quantize, run


def _ort_quantize_static(model, batches, x, tmp_path):
    return ort_quantize_static(model, batches, x, tmp_path)


def _block():
    torch.manual_seed(0)
    return Block().eval(), [torch.randn(2, 16, 32) for _ in range(4)], torch.randn(2, 16, 32)


def _ort_quantize_dynamic(model, x, tmp_path):
    return ort_quantize_dynamic(model, x, tmp_path)[1]


@pytest.fixture(scope="module")
def dynamic_block(tmp_path_factory):
    """The block, ORT's quantize_dynamic model of it and its optimized graph's op counts."""
    tmp = tmp_path_factory.mktemp("dynamic_block")
    model, batches, x = _block()
    theirs = _ort_quantize_dynamic(model, x, tmp)
    return model, batches, x, theirs, int8_kernels(theirs), tmp


def test_dynamic_block_runs_every_product_as_an_integer_kernel_with_matmul_const_b_only_false(dynamic_block):
    model, batches, x, theirs, their_ops, tmp = dynamic_block
    quantizer = ORTQuantizer(is_dynamic=True, reduce_range=REDUCE_RANGE, matmul_const_b_only=False)
    converted, path = _quantize(model, batches, x, quantizer, tmp / "d_all.onnx")
    ops = int8_kernels(path)
    assert products(ops) == (8, 0), ops  # 6 linears, 2 attention matmuls
    assert ops.get("DynamicQuantizeMatMul", 0) >= 1
    (got,) = _run(path, x)
    assert _sqnr(converted(x).detach().numpy(), got) > 40  # ORT computes what the converted model computes
    # ORT's own quantize_dynamic leaves the two attention matmuls (activation x activation) float
    assert products(their_ops) == (6, 2)
    reference = model(x).detach().numpy()
    # two more products in int8 than ORT's model: up to 1 dB below it (seen: within 0.3 dB with
    # reduce_range on a CPU without VNNI, 0.48 dB below at full range on one with VNNI)
    assert _sqnr(reference, got) >= _sqnr(reference, _run(theirs, x)[0]) - 1.0


def test_dynamic_block_by_default_is_what_ort_runs_for_quantize_dynamics_model(dynamic_block):
    """Default (matmul_const_b_only, as quantize_dynamic): ORT's optimized graph of ours has the
    op counts of ORT's optimized graph of its own model (the attention matmuls float, their
    scale folded into a FusedMatMul), and the same SQNR within 0.3 dB."""
    model, batches, x, theirs, their_ops, tmp = dynamic_block
    converted, path = _quantize(
        model, batches, x, ORTQuantizer(is_dynamic=True, reduce_range=REDUCE_RANGE), tmp / "d.onnx"
    )
    ops = int8_kernels(path)
    assert ops == their_ops
    assert products(ops) == (6, 2), ops
    (got,) = _run(path, x)
    assert _sqnr(converted(x).detach().numpy(), got) > 40
    reference = model(x).detach().numpy()
    assert _sqnr(reference, got) >= _sqnr(reference, _run(theirs, x)[0]) - 0.3


def test_dynamic_model_takes_another_sequence_length(tmp_path):
    model, batches, x = _block()
    shapes = {"x": {1: torch.export.Dim("seq", min=2, max=64)}}
    quantizer = ORTQuantizer(is_dynamic=True, reduce_range=REDUCE_RANGE)
    converted, path = _quantize(model, batches, x, quantizer, tmp_path / "seq.onnx", dynamic_shapes=shapes)
    other = torch.randn(2, 9, 32)
    (got,) = _run(path, other)
    assert got.shape == (2, 9, 32)
    assert _sqnr(converted(other).detach().numpy(), got) > 40


def test_static_block_every_product_int8_and_sqnr_at_least_quantize_static(tmp_path):
    model, batches, x = _block()
    converted, path = _quantize(model, batches, x, ORTQuantizer(reduce_range=REDUCE_RANGE), tmp_path / "s.onnx")
    ops = int8_kernels(path)
    assert products(ops) == (8, 0), ops
    assert ops.get("QLinearSoftmax") == 1
    (got,) = _run(path, x)
    assert _sqnr(converted(x).detach().numpy(), got) > 30
    _, theirs = _ort_quantize_static(model, batches, x, tmp_path)
    reference = model(x).detach().numpy()
    assert _sqnr(reference, got) >= _sqnr(reference, _run(theirs, x)[0]) - 0.3


class Shapes(torch.nn.Module):
    """conv -> split -> two convs -> cat -> nearest resize -> conv -> sigmoid, and softmax over 16."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2, self.c3 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c4 = torch.nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, x):
        a, b = torch.split(F.relu(self.c1(x)), 8, dim=1)
        z = self.c4(F.interpolate(torch.cat([self.c2(a), self.c3(b)], 1), scale_factor=2.0, mode="nearest"))
        return torch.sigmoid(z), torch.softmax(z.mean((2, 3)).reshape(2, 2, 2).flatten(1), -1)


def test_split_resize_sigmoid_and_softmax_run_on_int8_data(tmp_path):
    torch.manual_seed(0)
    model, x = Shapes().eval(), torch.randn(2, 3, 16, 16)
    converted, path = _quantize(
        model,
        [torch.randn(2, 3, 16, 16) for _ in range(4)],
        x,
        ORTQuantizer(reduce_range=REDUCE_RANGE),
        tmp_path / "shapes.onnx",
    )
    ops = int8_kernels(path)
    assert ops.get("QLinearConv") == 4 and products(ops)[1] == 0, ops
    assert ops.get("QLinearConcat") == 1 and ops.get("QLinearSigmoid") == 1, ops
    # split and resize keep the int8 data (no DequantizeLinear in front of them in ORT's graph)
    import onnx

    optimized = tmp_path / "optimized.onnx"
    ort_session(path, optimized_model_path=optimized)
    graph = onnx.load(str(optimized)).graph
    producer = {o: n for n in graph.node for o in n.output}
    for op in ("Split", "Resize"):
        node = next(n for n in graph.node if n.op_type == op)
        assert producer[node.input[0]].op_type != "DequantizeLinear", op
    sigmoid, _ = _run(path, x)
    expected = converted(x)[0].detach().numpy()
    assert np.abs(sigmoid - expected).max() <= 3 * _output_step(converted) + 1e-6 or _sqnr(expected, sigmoid) > 30


class ConvBN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.c2, self.b2 = torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)) + y)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def test_qat_trains_converts_and_runs_its_convs_as_int8_kernels(tmp_path):
    torch.manual_seed(0)
    model, x = ConvBN(), torch.randn(4, 3, 16, 16)
    quantizer = ORTQuantizer(is_qat=True, reduce_range=REDUCE_RANGE)
    prepared = qw.prepare_qat_pt2e(torch.export.export(model.train(), (x,)).module(), quantizer)
    optimizer = torch.optim.SGD(prepared.parameters(), lr=1e-3)
    for _ in range(3):
        loss = prepared(torch.randn(4, 3, 16, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    qw.move_exported_model_to_eval(prepared)
    converted = qw.convert_pt2e(prepared)
    assert not any("batch_norm" in str(n.target) for n in converted.graph.nodes)  # folded
    path = to_onnx(converted, (x,), tmp_path / "qat.onnx")
    ops = int8_kernels(path)
    assert ops.get("QLinearConv") == 2 and ops.get("QLinearAdd") == 1 and products(ops) == (3, 0), ops
    (got,) = _run(path, x)
    assert np.abs(got - converted(x).detach().numpy()).max() <= 3 * _output_step(converted) + 1e-6


def test_dynamic_composed_with_the_embedding_plugin_through_export(tmp_path):
    from quantweave_embedding import EmbeddingQuantizer
    from quantweave_onnxruntime.testing import TokenMLP

    torch.manual_seed(0)
    model, tokens = TokenMLP().eval(), torch.randint(0, 100, (4, 16))
    composed = qw.ComposableQuantizer([EmbeddingQuantizer(), ORTQuantizer(is_dynamic=True, reduce_range=REDUCE_RANGE)])
    prepared = qw.prepare_pt2e(torch.export.export(model, (tokens,)).module(), composed)
    prepared(tokens)
    converted = qw.convert_pt2e(prepared)
    path = to_onnx(converted, (tokens,), tmp_path / "tokens.onnx")
    import onnx

    graph = onnx.load(str(path)).graph
    eight_bit = {t.name for t in graph.initializer if t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)}
    gather = next(n for n in graph.node if n.op_type == "Gather")
    table = next(n for n in graph.node if n.output[0] == gather.input[0])
    assert table.op_type == "DequantizeLinear" and table.input[0] in eight_bit
    assert products(int8_kernels(path)) == (2, 0)
    (got,) = _run(path, tokens)
    # ORT's fused DynamicQuantizeMatMul chooses the activation qparams itself: on the table's
    # grid-valued rows its output is ~35 dB from the converted model's (136 dB without the
    # table), as accurate against the float model as the converted model is
    expected, reference = converted(tokens).detach().numpy(), model(tokens).detach().numpy()
    assert _sqnr(expected, got) > 30
    assert _sqnr(reference, got) >= _sqnr(reference, expected) - 0.5


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_bert_from_a_config_every_linear_and_attention_matmul_int8(tmp_path, dynamic):
    pytest.importorskip("transformers", reason="needs transformers (tox -e onnxruntime)")
    from quantweave_onnxruntime.testing import bert

    torch.manual_seed(0)
    model, ids = bert().eval(), torch.randint(0, 100, (2, 16))
    batches = [torch.randint(0, 100, (2, 16)) for _ in range(4)]
    # dynamic: the attention matmuls too (quantize_dynamic leaves them float, as ours by default)
    quantizer = ORTQuantizer(is_dynamic=dynamic, reduce_range=REDUCE_RANGE, matmul_const_b_only=False)
    converted, path = _quantize(model, batches, ids, quantizer, tmp_path / "bert.onnx")
    assert products(int8_kernels(path)) == (16, 0)  # 2 x (4 projections + 2 MLP linears + 2 attention matmuls)
    (got,) = _run(path, ids)
    assert _sqnr(converted(ids).detach().numpy(), got) > 30
    reference = model(ids).detach().numpy()
    if dynamic:
        theirs = _ort_quantize_dynamic(model, ids, tmp_path)
    else:
        _, theirs = _ort_quantize_static(model, batches, ids, tmp_path)
    assert _sqnr(reference, got) >= _sqnr(reference, _run(theirs, ids)[0]) - 0.3


def test_symmetric_int8_activations_form_what_ort_forms_for_its_own_symmetric_model(tmp_path):
    model, batches, x = ort_cnn()
    # the default observer: MinMax with symmetric activations (torch's histogram search is affine)
    quantizer = ORTQuantizer(activation_dtype="int8", symmetric_activations=True, reduce_range=REDUCE_RANGE)
    assert quantizer.observer == "minmax"
    converted, path = _quantize(model, batches, x, quantizer, tmp_path / "sym.onnx")
    _, theirs = ort_quantize_static(model, batches, x, tmp_path, activation_type="int8", symmetric_activations=True)
    ours_ops, their_ops = int8_kernels(path), int8_kernels(theirs)
    assert products(ours_ops) == products(their_ops), (ours_ops, their_ops)
    reference = model(x).detach().numpy()
    (got,) = _run(path, x)
    assert _sqnr(reference, got) >= _sqnr(reference, _run(theirs, x)[0]) - 0.3
    assert _sqnr(converted(x).detach().numpy(), got) > 30

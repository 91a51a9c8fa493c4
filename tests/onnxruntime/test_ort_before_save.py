"""What to_onnx does to the exported model before writing it (tox env ``onnxruntime``): the
exporter's debug metadata dropped by default (the same nodes, initializers and ORT outputs, a
smaller file; ``keep_metadata=True`` keeps it), and a scalar Mul between a DequantizeLinear and a
QuantizeLinear given a quantized constant so that ORT runs it as QLinearMul."""

import numpy as np
import pytest
import torch

import quantweave as qw
from quantweave_onnxruntime import ORTQuantizer, _onnx_cleanup, int8_kernels, to_onnx
from quantweave_onnxruntime.testing import CNN, REDUCE_RANGE, output_step, run

onnx = pytest.importorskip("onnx", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")
pytest.importorskip("onnxruntime", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")

pytestmark = pytest.mark.onnxruntime


def _strip(model):
    graph = model.graph
    for node in graph.node:
        del node.metadata_props[:]
    del graph.metadata_props[:]
    return graph


def test_to_onnx_drops_the_exporters_debug_metadata_and_ort_computes_the_same(tmp_path):
    torch.manual_seed(0)
    model, x = CNN().eval(), torch.randn(2, 3, 16, 16)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), ORTQuantizer())
    qw.calibrate(prepared, [torch.randn(2, 3, 16, 16) for _ in range(2)], progress=False)
    converted = qw.convert_pt2e(prepared)
    kept = to_onnx(converted, (x,), tmp_path / "kept.onnx", keep_metadata=True)
    dropped = to_onnx(converted, (x,), tmp_path / "dropped.onnx")
    with_meta, without = onnx.load(str(kept)), onnx.load(str(dropped))
    # kept: the exporter's stack traces / FX nodes per node and the program's graph signature
    assert all(any(p.key.startswith("pkg.torch.onnx.") for p in n.metadata_props) for n in with_meta.graph.node)
    assert any(p.key.startswith("pkg.torch.") for p in with_meta.graph.metadata_props)
    # dropped: none of it, everything else the same (nodes, attributes, initializers, value infos)
    assert not any(n.metadata_props for n in without.graph.node)
    assert not any(p.key.startswith("pkg.torch.") for p in without.graph.metadata_props)
    a, b = _strip(with_meta), _strip(without)
    assert a.SerializeToString() == b.SerializeToString()
    assert dropped.stat().st_size < 0.7 * kept.stat().st_size
    np.testing.assert_array_equal(run(kept, x)[0], run(dropped, x)[0])


class _Scaled(torch.nn.Module):
    """linear -> times a scalar -> linear (as attention scales its scores before the softmax)."""

    def __init__(self, c: float) -> None:
        super().__init__()
        self.c = c
        self.fc, self.out = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.fc(x) * self.c)


@pytest.mark.parametrize("c", [0.125, -0.5])
def test_a_scalar_mul_between_dequantize_and_quantize_runs_as_qlinearmul_with_the_same_outputs(
    c, tmp_path, monkeypatch
):
    torch.manual_seed(0)
    model, x = _Scaled(c).eval(), torch.randn(4, 8, 16)
    quantizer = ORTQuantizer(reduce_range=REDUCE_RANGE)  # 7-bit weights on CPUs without VNNI
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    qw.calibrate(prepared, [torch.randn(4, 8, 16) for _ in range(2)], progress=False)
    converted = qw.convert_pt2e(prepared)
    path = to_onnx(converted, (x,), tmp_path / "rule.onnx")
    graph = onnx.load(str(path)).graph
    (mul,) = [n for n in graph.node if n.op_type == "Mul"]
    producers = {o: n for n in graph.node for o in n.output}
    assert [producers[i].op_type for i in mul.input] == ["DequantizeLinear", "DequantizeLinear"]
    ops = int8_kernels(path)
    assert ops.get("QLinearMul") == 1 and "Mul" not in ops, ops
    # without the rule: a float Mul between DequantizeLinear and QuantizeLinear, the same outputs
    monkeypatch.setattr(_onnx_cleanup, "quantize_constant_muls", lambda model: 0)
    plain = to_onnx(converted, (x,), tmp_path / "plain.onnx")
    assert int8_kernels(plain).get("Mul") == 1
    got = run(path, x)[0]
    np.testing.assert_array_equal(got, run(plain, x)[0])
    assert np.abs(got - converted(x).detach().numpy()).max() <= output_step(converted) + 1e-6

"""XNNPACK on what torchvision and transformers write (quantizer side; the ExecuTorch runtime
side is tests/xnnpack/test_executorch_inplace_products.py): the in-place residual add of a
BasicBlock is quantized as add, and GPT-2's Conv1D (addmm of an [in, out] weight), mm and
``x @ W`` as linears with the weight per channel on axis 1."""

import pytest
import torch

import quantweave as qw
import quantweave_xnnpack as qx
from tests.helpers import export
from tests.library_style import BasicBlock, Mlp

DEQUANTIZE_PER_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"


def _prepare(model, *inputs, **config):
    quantizer = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(**config))
    return qw.prepare_pt2e(export(model.eval(), *inputs), quantizer), quantizer


def test_the_in_place_residual_add_and_relus_are_quantized():
    prepared, quantizer = _prepare(BasicBlock(), torch.randn(1, 3, 8, 8), is_per_channel=True)
    report = qw.annotation_report(prepared, quantizer)
    assert report.float == 0, report.to_table()
    assert {r.node: r.op for r in report.nodes}["add_"] == "aten.add.Tensor"


@pytest.mark.parametrize("config", [{"is_per_channel": True}, {}, {"is_per_channel": True, "is_dynamic": True}])
def test_products_with_a_constant_weight_are_quantized_as_linears(config):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 16)
    prepared, quantizer = _prepare(Mlp(), x, **config)
    rows = {r.node: r for r in qw.annotation_report(prepared, quantizer).nodes}
    assert rows["addmm"].status == rows["addmm_1"].status == rows["matmul"].status == "quantized"
    qw.calibrate(prepared, [(x,)], progress=False)
    converted = qw.convert_pt2e(prepared)
    axes = [n.args[3] for n in converted.graph.nodes if str(n.target) == DEQUANTIZE_PER_CHANNEL]
    assert axes == ([1, 1, 1] if config.get("is_per_channel") else [])


def test_a_product_of_two_activations_stays_float_with_a_reason():
    class Attention(torch.nn.Module):
        def forward(self, q, k):
            return q @ k.transpose(-1, -2)

    q = torch.randn(1, 4, 8)
    prepared, quantizer = _prepare(Attention(), q, q)
    (row,) = [r for r in qw.annotation_report(prepared, quantizer).nodes if r.op == "aten.matmul.default"]
    assert row.status == "float" and "matmul" in row.reason and "constant" in row.reason, row


def test_the_product_rows_declare_the_weight_on_axis_1():
    caps = {c.pattern: c for c in qx.declared_capabilities(is_per_channel=True)}
    assert {caps[p].weight.ch_axis for p in ("addmm", "mm", "matmul_weight")} == {1}
    assert caps["linear"].weight.ch_axis == 0 and caps["mm"].bias is None

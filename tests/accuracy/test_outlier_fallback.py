"""A quantization-hostile layer on real data: conv2 reads a tensor with one channel 1000x
larger than the others (same float function). The debugger ranks conv2 first; the
fallback leaves exactly conv2 (and the relu fused with it) float and recovers accuracy."""

import pytest
import torch

import quantweave as qw
from quantweave.testing import digits

from .cases import PLUGINS, available, quantizer

pytestmark = pytest.mark.accuracy


@pytest.fixture(scope="module")
def hostile(trained, data):
    model = digits.make_outlier_channel(trained["cnn"][0], channel=3, factor=1000.0)
    float_acc = digits.accuracy(model, data.test_x, data.test_y)
    assert float_acc == pytest.approx(trained["cnn"][1], abs=0.3)  # the same function in float
    return digits.export_digits(model), float_acc


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
def test_debugger_ranks_the_hostile_layer_first_and_fallback_leaves_only_it_float(data, hostile, plugin):
    if not available(plugin):
        pytest.skip(f"{PLUGINS[plugin][0]} is not installed")
    exported, float_acc = hostile
    calibration = digits.batches(data.train_x, 256)

    def evaluate(model: torch.nn.Module) -> float:
        return digits.accuracy(model, data.test_x, data.test_y)

    converted = digits.quantize_ptq(exported, quantizer(plugin), data)
    broken = evaluate(converted)
    assert broken < float_acc - 20  # quantizing conv2's input flattens every other channel
    report = qw.compare(exported, converted, digits.batches(data.train_x[:256], 128))
    print(report.to_table())
    assert report.ops[0].node == "conv2d_1" and report.ops[0].module == "conv2"
    assert report.ops[0].sqnr_db < 5 < report.ops[1].sqnr_db

    result = qw.fallback(exported, quantizer(plugin), calibration, evaluate, max_drop=1.0)
    print(result.summary())
    assert result.met and result.quantized_score == broken
    assert [unit.nodes for unit in result.left_float] == [("conv2d_1", "relu_1")]
    assert result.score >= float_acc - 1.0
    assert evaluate(result.model) == result.score

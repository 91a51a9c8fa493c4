"""Float, PTQ and QAT accuracy on real data (scikit-learn's digits, 360 test images: one
image is 0.28 points), for every first-party plugin that supports the model."""

import pytest

from quantweave.testing import digits

from .cases import MODEL_NAMES, PLUGINS, available, quantizer

pytestmark = pytest.mark.accuracy


def _plugin(name: str) -> str:
    if not available(name):
        pytest.skip(f"{PLUGINS[name][0]} is not installed")
    return name


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_float_models_learn_the_digits(trained, model):
    assert trained[model][1] > 95.0


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_ptq_is_within_one_point_of_float(data, trained, plugin, model):
    float_model, float_acc = trained[model]
    converted = digits.quantize_ptq(float_model, quantizer(_plugin(plugin)), data)
    acc = digits.accuracy(converted, data.test_x, data.test_y)
    print(f"{model} {plugin} PTQ {acc:.2f} (float {float_acc:.2f})")
    assert acc >= float_acc - 1.0


@pytest.mark.parametrize("plugin", sorted(p for p, (_, _, qat) in PLUGINS.items() if qat))
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_qat_is_within_half_a_point_of_float(data, trained, plugin, model):
    float_model, float_acc = trained[model]
    converted = digits.quantize_qat(float_model, quantizer(_plugin(plugin), qat=True), data)
    acc = digits.accuracy(converted, data.test_x, data.test_y, batch_size=digits.QAT_BATCH)
    print(f"{model} {plugin} QAT {acc:.2f} (float {float_acc:.2f})")
    assert acc >= float_acc - 0.5

"""Peer parity: the same annotations give the same qparams and outputs as torchao 0.18.

Both flows run the *same* annotation code (written once against an API namespace), on
fresh exports of the same model, with the same calibration data. We compare every
dequantize node's qparams, keyed by (consumer, producer), and the converted outputs.
Expected difference: none (max abs difference 0).
"""

import pytest
import torch

import quantweave as qw
from quantweave.testing import models
from quantweave.testing.inspect import qdq_summary
from quantweave.testing.reference import make_reference_quantizer, quantweave_api
from tests.helpers import export
from tests.tutorial import FLOWS, build

pytestmark = pytest.mark.peer


def run_both(model, inputs, calibration, make_quantizer, torchao_api, torchao_flow):
    results = []
    flows = [(quantweave_api(), qw.prepare_pt2e, qw.convert_pt2e), (torchao_api, *torchao_flow)]
    for api, prepare, convert in flows:
        prepared = prepare(export(model, *inputs), make_quantizer(api))
        for batch in calibration:
            prepared(*batch)
        converted = convert(prepared)
        results.append((qdq_summary(converted), converted(*inputs)))
    return results


REFERENCE_MODELS = {
    "resnet_like": (lambda: models.resnet18_like(width=8, num_classes=10), {}),
    "resnet_like_derived_bias": (lambda: models.resnet18_like(width=8, num_classes=10), {"derived_bias": True}),
    "mobilenet_like_histogram": (lambda: models.MobileNetLike().eval(), {"histogram": True}),
    "encoder_block": (lambda: models.encoder_block(), {}),
    "small_lm": (lambda: models.SmallLM().eval(), {}),
}


@pytest.mark.parametrize("name", sorted(REFERENCE_MODELS))
def test_reference_quantizer_matches_torchao(name, torchao_api, torchao_flow):
    factory, options = REFERENCE_MODELS[name]
    torch.manual_seed(0)
    model = factory()
    inputs = models.example_inputs(model)
    calibration = models.calibration_batches(model, 3)
    (ours, out), (theirs, ref) = run_both(
        model, inputs, calibration, lambda api: make_reference_quantizer(api, **options), torchao_api, torchao_flow
    )
    assert len(ours) > 0
    assert ours == theirs
    assert torch.equal(out, ref), f"max abs difference {(out - ref).abs().max().item()}"


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_tutorial_flows_match_torchao(name, torchao_api, torchao_flow):
    model_cls, make_inputs, quantizer_name = FLOWS[name]
    torch.manual_seed(0)
    model = model_cls().eval()
    inputs = make_inputs()
    calibration = [make_inputs() for _ in range(3)]
    (ours, out), (theirs, ref) = run_both(
        model, inputs, calibration, lambda api: getattr(build(api), quantizer_name)(), torchao_api, torchao_flow
    )
    assert ours == theirs
    assert torch.equal(out, ref), f"max abs difference {(out - ref).abs().max().item()}"

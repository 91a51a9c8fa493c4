"""Hosting torchao quantizers (issue #21): a quantizer written against torchao 0.18's
``torchao.quantization.pt2e.quantizer`` -- its annotations, specs and observers all
torchao's classes -- run through quantweave's prepare / calibrate / convert gives the model
torchao's own prepare_pt2e / convert_pt2e gives: the same number of quantize / dequantize
nodes, the same q/dq decisions and a max abs difference of 0 on the same inputs.

Quantizers: the reference quantizer written against torchao's names (a torchao
``Quantizer`` subclass with torchao's observers), and torchao's own XNNPACK-like test
quantizer (``torchao.testing.pt2e._xnnpack_quantizer``) in its static per-tensor,
per-channel and dynamic configurations. Models: conv-bn-relu, an MLP, an attention block.
"""

import pytest
import torch
from torch import nn

import quantweave as qw
from quantweave.convert import dequantize_ops, quantize_ops
from quantweave.testing import models
from quantweave.testing.inspect import qdq_summary
from quantweave.testing.reference import make_reference_quantizer
from tests.helpers import export, share_through_a_missing_edge

pytestmark = pytest.mark.peer
xnnpack_like = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")


class ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _conv_bn_relu():
    model = ConvBnRelu().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(2, 3, 16, 16),)


MODELS = {
    "conv_bn_relu": _conv_bn_relu,
    "mlp": lambda: (MLP().eval(), (torch.randn(4, 16),)),
    "attention": lambda: (models.encoder_block().eval(), (torch.randn(2, 8, 64),)),
}


def _xnnpack(**config):
    def make(api):
        return xnnpack_like.XNNPACKQuantizer().set_global(xnnpack_like.get_symmetric_quantization_config(**config))

    return make


QUANTIZERS = {
    "reference": lambda api: make_reference_quantizer(api),
    "reference_derived_bias": lambda api: make_reference_quantizer(api, derived_bias=True),
    "xnnpack_per_tensor": _xnnpack(),
    "xnnpack_per_channel": _xnnpack(is_per_channel=True),
    "xnnpack_dynamic": _xnnpack(is_per_channel=True, is_dynamic=True),
}


def qdq_count(gm):
    ops = (*quantize_ops(), *dequantize_ops())
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in ops)


def run(flow, model, inputs, quantizer):
    prepare, convert = flow
    prepared = prepare(export(model, *inputs), quantizer)
    for scale in (1.0, 0.5, 2.0):
        prepared(*(x * scale for x in inputs))
    converted = convert(prepared)
    return converted, converted(*inputs)


@pytest.mark.parametrize("quantizer", sorted(QUANTIZERS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_torchao_quantizer_converts_through_quantweave_as_through_torchao(name, quantizer, torchao_api, torchao_flow):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    make = QUANTIZERS[quantizer]
    ours, out = run((qw.prepare_pt2e, qw.convert_pt2e), model, inputs, make(torchao_api))
    theirs, ref = run(torchao_flow, model, inputs, make(torchao_api))
    assert not isinstance(make(torchao_api), qw.Quantizer)
    assert qdq_count(ours) == qdq_count(theirs)
    # XNNPACK's dynamic configuration quantizes linear only: the conv model stays float on both sides
    assert qdq_count(ours) > 0 or (name, quantizer) == ("conv_bn_relu", "xnnpack_dynamic")
    assert qdq_summary(ours) == qdq_summary(theirs)
    assert torch.equal(out, ref), f"max abs difference {(out - ref).abs().max().item()}"


def test_a_shared_spec_naming_a_missing_edge_converts_as_torchao(torchao_api, torchao_flow):
    torch.manual_seed(0)
    model, inputs = MODELS["mlp"]()
    ours, out = run((qw.prepare_pt2e, qw.convert_pt2e), model, inputs, share_through_a_missing_edge(torchao_api))
    theirs, ref = run(torchao_flow, model, inputs, share_through_a_missing_edge(torchao_api))
    assert qdq_count(ours) == qdq_count(theirs) > 0
    assert qdq_summary(ours) == qdq_summary(theirs)
    assert torch.equal(out, ref), f"max abs difference {(out - ref).abs().max().item()}"


def test_torchao_observers_are_recognised_and_calibrated(torchao_api):
    from torchao.quantization.pt2e.observer import ObserverBase as TorchaoObserverBase

    model, inputs = MODELS["mlp"]()
    prepared = qw.prepare_pt2e(export(model, *inputs), make_reference_quantizer(torchao_api))
    observers = [m for m in prepared.modules() if isinstance(m, TorchaoObserverBase)]
    assert observers and all(qw.observers.is_observer_module(m) for m in observers)
    result = qw.calibrate(prepared, [inputs])
    assert result.observers > 0 and result.observed == result.observers


def test_torchao_affine_observers_are_taken_and_convert_themselves(torchao_api):
    from torchao.quantization.granularity import PerTensor
    from torchao.quantization.pt2e._affine_quantization import AffineQuantizedMinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec, Quantizer
    from torchao.quantization.quant_primitives import MappingType

    ctr = AffineQuantizedMinMaxObserver.with_args(
        mapping_type=MappingType.SYMMETRIC, target_dtype=torch.int8, granularity=PerTensor()
    )

    class Affine(Quantizer):
        def annotate(self, model):
            linear = next(n for n in model.graph.nodes if n.target == torch.ops.aten.linear.default)
            spec = QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=ctr)
            linear.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={linear.args[0]: spec}, _annotated=True
            )
            return model

        def validate(self, model):
            return None

    model, inputs = MODELS["mlp"]()
    prepared = qw.prepare_pt2e(export(model, *inputs), Affine())
    assert any(isinstance(m, AffineQuantizedMinMaxObserver) for m in prepared.modules())
    prepared(*inputs)
    converted = qw.convert_pt2e(prepared)  # the observer's own convert() writes torchao's affine q/dq
    assert any("quantize_affine" in str(n.target) for n in converted.graph.nodes)
    assert not any(isinstance(m, AffineQuantizedMinMaxObserver) for m in converted.modules())


def test_torchao_qat_fake_quantizers_convert(torchao_api):
    from torchao.quantization.pt2e.fake_quantize import FakeQuantizeBase as TorchaoFakeQuantizeBase

    torch.manual_seed(0)
    model, inputs = MODELS["mlp"]()
    quantizer = xnnpack_like.XNNPACKQuantizer().set_global(
        xnnpack_like.get_symmetric_quantization_config(is_per_channel=True, is_qat=True)
    )
    prepared = qw.prepare_qat_pt2e(torch.export.export(model.train(), inputs).module(), quantizer)
    missing = [n.name for n in prepared.graph.nodes if "val" not in n.meta and n.name not in ("output", "_guards_fn")]
    assert not missing  # the QAT rewrite's nodes and the fake-quantize nodes carry meta["val"] too
    fake_quants = [m for m in prepared.modules() if isinstance(m, TorchaoFakeQuantizeBase)]
    assert fake_quants and all(qw.observers.is_fake_quant_module(m) for m in fake_quants)
    prepared(*inputs)
    converted = qw.convert_pt2e(prepared)
    assert qdq_count(converted) > 0
    assert not any(isinstance(m, TorchaoFakeQuantizeBase) for m in converted.modules())

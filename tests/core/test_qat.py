"""prepare_qat_pt2e / convert_pt2e with conv + batch norm: simulate while training, fold at convert."""

import pytest
import torch
from torch import nn

import quantweave as qw
from quantweave.errors import ConvertError
from quantweave.observers import (
    FakeQuantize,
    FakeQuantizeBase,
    MovingAveragePerChannelMinMaxObserver,
)
from quantweave.plugin_api import mark_annotated
from quantweave.testing.inspect import sqnr
from tests.helpers import QAT_ACT as ACT
from tests.helpers import ConvBnQATQuantizer, assert_names

aten = torch.ops.aten


class ConvBnReLU(nn.Module):
    def __init__(self, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=bias)
        # momentum 1: the running statistics are the last batch's, so eval mode normalises
        # (and the output ranges learnt in training fit) like training did
        self.bn = nn.BatchNorm2d(8, eps=eps, momentum=1.0)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def batches(n=4):
    return [torch.randn(4, 3, 12, 12, generator=torch.Generator().manual_seed(i)) for i in range(n)]


def prepare(model, quantizer=None):
    torch.manual_seed(0)
    exported = torch.export.export(model.train(), (torch.randn(4, 3, 12, 12),)).module()
    return exported, qw.prepare_qat_pt2e(exported, quantizer or ConvBnQATQuantizer())


def float_model_of(prepared, model):
    """``model`` (eval mode) with the prepared model's trained parameters and statistics."""
    state = {k: v for k, v in prepared.state_dict().items() if k.split(".")[0] in ("conv", "bn")}
    model.load_state_dict(state)
    return model.eval()


def fake_quant(prepared, enabled):
    for module in prepared.modules():
        if isinstance(module, FakeQuantizeBase):
            module.enable_fake_quant(enabled)


@pytest.mark.parametrize("bias", [True, False])
def test_the_simulated_conv_bn_computes_what_the_float_model_computes(bias):
    torch.manual_seed(0)
    model = ConvBnReLU(bias=bias)
    _, prepared = prepare(model)
    assert any(n.target is aten.batch_norm.default for n in prepared.graph.nodes), "batch norm keeps training"
    fake_quant(prepared, False)
    reference = ConvBnReLU(bias=bias)
    reference.load_state_dict(model.state_dict())
    for x in batches():
        torch.testing.assert_close(prepared(x), reference.train()(x), rtol=1e-5, atol=1e-5)
    # the batch-norm statistics moved the same way in both
    state = dict(prepared.named_buffers())
    torch.testing.assert_close(state["bn.running_mean"], reference.bn.running_mean)
    torch.testing.assert_close(state["bn.running_var"], reference.bn.running_var)


@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_convert_folds_batch_norm_with_its_own_eps_and_running_statistics(eps):
    torch.manual_seed(0)
    model = ConvBnReLU(eps=eps)
    with torch.no_grad():  # conv outputs with variance ~1e-3 make eps matter (the peer assumes 1e-5)
        model.conv.weight.mul_(0.05)
        model.conv.bias.mul_(0.05)
    _, prepared = prepare(model)
    for x in batches():
        prepared(x)
    converted = qw.convert_pt2e(prepared)
    assert not any(n.target is aten.batch_norm.default for n in converted.graph.nodes)
    assert not any(n.target is aten.add_.Tensor for n in converted.graph.nodes), "num_batches_tracked update left"
    # the float reference in eval mode, with the statistics training produced
    reference = float_model_of(prepared, ConvBnReLU(eps=eps))
    x = torch.randn(4, 3, 12, 12)
    with torch.no_grad():
        assert sqnr(reference(x), converted(x)) > 30
        if eps != 1e-5:
            assumed = float_model_of(prepared, ConvBnReLU(eps=1e-5))
            assert sqnr(assumed(x), converted(x)) < 20, "folding with eps=1e-5 would be indistinguishable"
    weights = [v for k, v in converted.named_buffers() if v.dtype == torch.int8]
    assert weights, "the folded weight is stored as int8"


def test_training_the_prepared_model_leaves_the_callers_model_alone():
    torch.manual_seed(0)
    exported, prepared = prepare(ConvBnReLU())
    before = {k: v.clone() for k, v in exported.state_dict().items()}
    optimizer = torch.optim.SGD(prepared.parameters(), lr=0.1)
    for x in batches():
        optimizer.zero_grad()
        prepared(x).square().mean().backward()
        optimizer.step()
    after = exported.state_dict()
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.equal(value, after[key]), f"{key} of the caller's model changed"
    trained = dict(prepared.named_parameters())["conv.weight"]
    assert not torch.equal(trained, before["conv.weight"]), "the prepared model's own weight trains"


def test_training_reaches_the_converted_weights():
    torch.manual_seed(0)
    _, prepared = prepare(ConvBnReLU())
    for x in batches(2):
        prepared(x)
    untrained = qw.convert_pt2e(prepared)
    optimizer = torch.optim.SGD(prepared.parameters(), lr=0.5)
    for x in batches(3):
        optimizer.zero_grad()
        prepared(x).mean().backward()
        optimizer.step()
    trained = qw.convert_pt2e(prepared)
    x = torch.randn(4, 3, 12, 12)
    assert not torch.equal(untrained(x), trained(x))


def test_a_derived_bias_spec_follows_the_rewritten_weight_edge():
    torch.manual_seed(0)
    _, prepared = prepare(ConvBnReLU(bias=True), ConvBnQATQuantizer(quantize_bias=True))
    conv = next(n for n in prepared.graph.nodes if n.target is aten.conv2d.default)
    assert conv.args[2] is not None and conv.args[2].op == "call_module", "the (zero) bias is fake-quantized"
    for x in batches():
        prepared(x)
    converted = qw.convert_pt2e(prepared)
    conv = next(n for n in converted.graph.nodes if n.target is aten.conv2d.default)
    bias_dq = conv.args[2]
    assert "dequantize_per_channel" in str(bias_dq.target)
    assert bias_dq.args[-1] == torch.int32
    x = torch.randn(4, 3, 12, 12)
    with torch.no_grad():
        assert sqnr(float_model_of(prepared, ConvBnReLU(bias=True))(x), converted(x)) > 30


def test_convert_names_the_conv_whose_qat_pattern_was_edited():
    _, prepared = prepare(ConvBnReLU())
    for x in batches(1):
        prepared(x)
    bn = next(n for n in prepared.graph.nodes if n.target is aten.batch_norm.default)
    bn.replace_all_uses_with(bn.args[0])
    prepared.graph.erase_node(bn)
    prepared.recompile()
    with pytest.raises(ConvertError) as info:
        qw.convert_pt2e(prepared)
    assert_names(info, "'conv2d'", "conv-batch-norm", "changed", "prepare_qat_pt2e")


def test_an_unannotated_conv_bn_is_left_as_exported():
    class Nothing(qw.Quantizer):
        def annotate(self, model):
            return model

        def validate(self, model):
            pass

    exported, prepared = prepare(ConvBnReLU(), Nothing())
    ops = lambda gm: [n.target for n in gm.graph.nodes if n.op == "call_function"]  # noqa: E731
    assert ops(prepared) == ops(exported)


class ConvBnDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = ConvBnReLU()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.body(x))


def test_moving_a_prepared_model_to_eval_and_back():
    torch.manual_seed(0)
    model = ConvBnDropout()
    _, prepared = prepare(model)
    for x in batches():
        prepared(x)
    x = torch.randn(4, 3, 12, 12)
    assert qw.move_exported_model_to_eval(prepared) is prepared
    stats = {k: v.clone() for k, v in prepared.named_buffers() if k.startswith("body.bn") and "running" in k}
    assert stats, "the probe has batch-norm running statistics to watch"
    first, second = prepared(x), prepared(x)
    assert torch.equal(first, second), "eval mode: no dropout, running statistics"
    after = dict(prepared.named_buffers())
    assert [k for k, v in stats.items() if not torch.equal(v, after[k])] == []
    fake_quant(prepared, False)
    reference = ConvBnDropout()
    reference.load_state_dict({k: v for k, v in prepared.state_dict().items() if k.startswith("body.")})
    torch.testing.assert_close(prepared(x), reference.eval()(x), rtol=1e-5, atol=1e-5)
    qw.move_exported_model_to_train(prepared)
    assert not torch.equal(prepared(x), prepared(x)), "train mode: dropout is back"


def test_mode_helpers_reject_what_is_not_an_exported_module():
    with pytest.raises(TypeError) as info:
        qw.move_exported_model_to_eval(nn.Linear(2, 2))
    assert_names(info, "move_exported_model_to_eval", "GraphModule", "Linear")


WEIGHT_AXIS1 = qw.QuantizationSpec(
    dtype=torch.int8,
    quant_min=-127,
    quant_max=127,
    qscheme=torch.per_channel_symmetric,
    ch_axis=1,
    observer_or_fake_quant_ctr=FakeQuantize.with_args(
        observer=MovingAveragePerChannelMinMaxObserver.with_args(averaging_constant=1, ch_axis=1)
    ),
)


class ConvTransposeBnQATQuantizer(qw.Quantizer):
    """conv_transpose2d input and weight (per output channel: weight axis 1) and the output
    of the relu after its batch norm."""

    def annotate(self, model):
        for conv in model.graph.nodes:
            if conv.target is not aten.conv_transpose2d.input:
                continue
            conv.meta["quantization_annotation"] = qw.QuantizationAnnotation(
                input_qspec_map={conv.args[0]: ACT, conv.args[1]: WEIGHT_AXIS1}
            )
            (bn,) = conv.users
            (relu,) = bn.users
            relu.meta["quantization_annotation"] = qw.QuantizationAnnotation(output_qspec=ACT)
            mark_annotated([conv, bn, relu])
        return model


class ConvTransposeBnReLU(nn.Module):
    def __init__(self, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose2d(4, 8, 3, stride=2, groups=groups)
        self.bn = nn.BatchNorm2d(8, momentum=1.0)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_conv_transpose_batch_norm_is_simulated_on_weight_axis_1_and_folded_at_convert():
    torch.manual_seed(0)
    model = ConvTransposeBnReLU()
    x0 = torch.randn(4, 4, 6, 6)
    exported = torch.export.export(model.train(), (x0,)).module()
    prepared = qw.prepare_qat_pt2e(exported, ConvTransposeBnQATQuantizer())
    assert any(n.target is aten.batch_norm.default for n in prepared.graph.nodes), "batch norm keeps training"
    fake_quant(prepared, False)
    reference = ConvTransposeBnReLU()
    reference.load_state_dict(model.state_dict())
    data = [torch.randn(4, 4, 6, 6, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    for x in data:
        torch.testing.assert_close(prepared(x), reference.train()(x), rtol=1e-5, atol=1e-5)
    fake_quant(prepared, True)
    for x in data:
        prepared(x)
    converted = qw.convert_pt2e(prepared)
    assert not any(n.target is aten.batch_norm.default for n in converted.graph.nodes)
    # the converted model computes what the trained simulation computes with its qparams frozen
    qw.move_exported_model_to_eval(prepared)
    for module in prepared.modules():
        if isinstance(module, FakeQuantizeBase):
            module.disable_observer()
    state = {k: v for k, v in prepared.state_dict().items() if k.split(".")[0] in ("conv", "bn")}
    reference.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(converted(x0), prepared(x0), rtol=1e-5, atol=1e-5)
        # and stays close to the float model on data within the calibrated output range
        assert sqnr(reference.eval()(data[-1]), converted(data[-1])) > 30


def test_a_grouped_conv_transpose_is_left_with_its_batch_norm():
    torch.manual_seed(0)
    exported = torch.export.export(ConvTransposeBnReLU(groups=2).train(), (torch.randn(4, 4, 6, 6),)).module()
    prepared = qw.prepare_qat_pt2e(exported, ConvTransposeBnQATQuantizer())
    conv = next(n for n in prepared.graph.nodes if n.target is aten.conv_transpose2d.input)
    assert conv.args[1].op == "call_module", "the weight goes straight to its fake-quantizer: no simulated fold"
    for i in range(2):
        prepared(torch.randn(4, 4, 6, 6, generator=torch.Generator().manual_seed(i)))
    converted = qw.convert_pt2e(prepared)
    assert any(n.target is aten.batch_norm.default for n in converted.graph.nodes), "left unfolded, still runs"
    assert converted(torch.randn(4, 4, 6, 6)).isfinite().all()

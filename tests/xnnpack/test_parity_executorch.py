"""Peer parity: quantweave-xnnpack against ExecuTorch 1.5.1's XNNPACKQuantizer (with
torchao 0.18's prepare/convert), tox env ``xnnpack``.

Same model, same config, same calibration, fresh exports on both sides (each side's flow of the
three models made once per session: _cases.ours_flow / peer_flow, shared with the runtime and
hosting tests). After
post-training quantization (static per-tensor, static per-channel, dynamic): the same
annotations (every annotated compute node: each input edge's spec and the output spec),
the same q/dq decisions (scales, zero points, axes, ranges per consumer edge) and
identical converted outputs. After QAT the peer renames the conv nodes it rewrites, so
the q/dq decisions are compared as a multiset.

Every intended difference is asserted below on a model built to show it (see the package
README, "Differences from ExecuTorch"):

1. adaptive_avg_pool2d written functionally after a float producer is quantized by us;
   the peer finds it only through source partitions, which default non-strict
   torch.export records for modules, not for functional calls;
2. relu6 (aten.relu6 under torch.export) shares its producer's qparams like hardtanh;
3. module name / module type configs select a pattern by its anchor op, so they reach
   conv (+ relu) and linear + relu (the peer filters every node of the pattern, the
   weights included, which carry no module stack, so these never match);
4. an operator type config applies to that op, not to the op's whole family;
5. a Python scalar of an integer add / mul is left alone (the peer makes it a float
   buffer, turning the integer result into float);
6. cat respects the filter function (the peer annotates every cat);
7. QAT per-channel conv_transpose weights are quantized along their output channels
   (axis 1); the peer's fused fake-quantizer drops the axis and uses axis 0;
8. (no longer a difference) conv_transpose + batch norm in QAT is simulated and folded, as
   the peer does; our transposed weight keeps axis 1 (difference 7).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quantweave_xnnpack as qx
from quantweave.testing import models
from quantweave.testing.inspect import qdq_summary
from tests.helpers import spec_key

from ._cases import CONFIGS, MODELS, example_inputs, ours_flow, peer_flow, peer_quantizer, peer_run, run_flow

pytestmark = pytest.mark.executorch
xq = pytest.importorskip(
    "executorch.backends.xnnpack.quantizer.xnnpack_quantizer", reason="needs ExecuTorch 1.5.1 (tox -e xnnpack)"
)
pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")  # the peer flows (_cases.peer_run)

KEY = "quantization_annotation"
aten = torch.ops.aten


def ours_quantizer(**config):
    return qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(**config))


def annotations(gm):
    """{compute node: ({input role: spec}, output spec)} for every annotated call_function."""
    out = {}
    for node in gm.graph.nodes:
        annotation = node.meta.get(KEY)
        if node.op != "call_function" or annotation is None:
            continue
        inputs = {}
        constants = 0
        for producer, spec in annotation.input_qspec_map.items():
            role = producer.name
            if producer.op == "get_attr":  # weight, bias: named differently after batch-norm folding
                role, constants = f"constant {constants}", constants + 1
            inputs[role] = spec_key(spec)
        if any(v is not None for v in inputs.values()) or annotation.output_qspec is not None:
            out[node.name] = (inputs, spec_key(annotation.output_qspec))
    return out


# -- the three models, four configs ---------------------------------------------------------------

PTQ = [(m, c) for m in MODELS for c in CONFIGS if c != "qat"]


@pytest.mark.parametrize(("model_name", "config_name"), PTQ)
def test_same_annotations_qparams_and_outputs(model_name, config_name):
    config = CONFIGS[config_name]
    prepared, converted = ours_flow(model_name, config_name)  # the runtime tests' models, made once
    peer_prepared, peer_converted = peer_flow(model_name, config_name)  # shared with test_hosting_executorch
    ours_ann, peer_ann = annotations(prepared), annotations(peer_prepared)
    assert len(ours_ann) >= (1 if config.get("is_dynamic") else 4)  # dynamic: the decoder's last conv only
    assert ours_ann == peer_ann
    summary = qdq_summary(converted)
    assert summary == qdq_summary(peer_converted)
    inputs = example_inputs(MODELS[model_name](), config)
    out, ref = converted(*inputs), peer_converted(*inputs)
    assert torch.equal(out, ref), f"max abs difference {(out - ref).abs().max().item()}"


#: the QAT cases: the runtime tests' MobileNet-like model (two blocks, every op kind; _cases.MODELS) and
#: transformer block, per-channel, made once per session on both sides (_cases.ours_flow / peer_flow)
QAT_SHARED = ("mobilenet_v2", "transformer_block")
QAT_CASES = {
    # per-tensor, without batch norm: no intended difference applies (7 and 8 are asserted below)
    "conv_transpose_decoder": (
        lambda: models.conv_transpose_decoder(bn=False),
        {"is_qat": True},
    ),
}


@pytest.mark.parametrize("name", sorted((*QAT_SHARED, *QAT_CASES)))
def test_qat_same_qparams_and_outputs(name):
    if name in QAT_SHARED:
        config = CONFIGS["qat"]
        _, converted = ours_flow(name, "qat")
        _, peer_converted = peer_flow(name, "qat")
        inputs = example_inputs(MODELS[name](), config)
    else:
        factory, config = QAT_CASES[name]
        torch.manual_seed(0)
        _, converted = run_flow(factory(), config, ours_quantizer(**config))
        torch.manual_seed(0)
        _, peer_converted = peer_run(factory(), config, peer_quantizer(**config))
        inputs = example_inputs(factory(), config)
    ours, theirs = qdq_summary(converted), qdq_summary(peer_converted)
    assert len(ours) >= 8
    assert sorted(map(repr, ours.values())) == sorted(map(repr, theirs.values()))
    assert not any(n.target == aten.batch_norm.default for n in converted.graph.nodes)
    out, ref = converted(*inputs), peer_converted(*inputs)
    assert torch.equal(out, ref), f"max abs difference {(out - ref).abs().max().item()}"


def _weight_axes(converted, target):
    """{axis} of the per-channel dequantize feeding ``target`` nodes' weights."""
    axes = set()
    for node in converted.graph.nodes:
        if node.target == target and isinstance(node.args[1], torch.fx.Node):
            dq = node.args[1]
            if "dequantize_per_channel" in str(dq.target):
                axes.add(dq.args[3])
    return axes


def test_difference_7_qat_per_channel_conv_transpose_axis():
    config = {"is_qat": True, "is_per_channel": True}
    _, converted = run_flow(models.conv_transpose_decoder(bn=False), config, ours_quantizer(**config))
    _, peer_converted = peer_run(models.conv_transpose_decoder(bn=False), config, peer_quantizer(**config))
    assert _weight_axes(converted, aten.conv_transpose2d.input) == {1}
    assert _weight_axes(peer_converted, aten.conv_transpose2d.input) == {0}
    assert _weight_axes(converted, aten.conv2d.default) == _weight_axes(peer_converted, aten.conv2d.default) == {0}


def test_qat_conv_transpose_batch_norm_is_folded_as_the_peer_folds_it():
    _, converted = ours_flow("conv_transpose_decoder", "qat")  # models.conv_transpose_decoder(), CONFIGS["qat"]
    _, peer_converted = peer_flow("conv_transpose_decoder", "qat")

    def batch_norms(gm):
        return sum(n.target == aten.batch_norm.default for n in gm.graph.nodes)

    assert batch_norms(converted) == 0 and batch_norms(peer_converted) == 0
    assert _weight_axes(converted, aten.conv_transpose2d.input) == {1}


# -- intended differences on small models ------------------------------------------------------------


class Fn(nn.Module):
    def __init__(self, fn, **modules):
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)
        self.fn = fn

    def forward(self, *xs):
        return self.fn(self, *xs)


def annotate_both(model, inputs, ours, peer):
    ours_gm = ours.transform_for_annotation(torch.export.export(model.eval(), inputs).module())
    ours.annotate(ours_gm)
    peer_gm = peer.transform_for_annotation(torch.export.export(model.eval(), inputs).module())
    peer.annotate(peer_gm)
    return annotations(ours_gm), annotations(peer_gm)


def img(c=3):
    return (torch.randn(1, c, 8, 8),)


def test_difference_1_functional_adaptive_avg_pool2d_after_a_float_producer():
    model = Fn(lambda m, x: F.adaptive_avg_pool2d(torch.sigmoid(x), 1))
    ours, peer = annotate_both(model, img(), ours_quantizer(), peer_quantizer())
    assert "adaptive_avg_pool2d" in ours and "adaptive_avg_pool2d" not in peer
    # the module form has a source partition: both annotate it, identically
    model = Fn(lambda m, x: m.pool(torch.sigmoid(x)), pool=nn.AdaptiveAvgPool2d(1))
    ours, peer = annotate_both(model, img(), ours_quantizer(), peer_quantizer())
    assert ours["adaptive_avg_pool2d"] == peer["adaptive_avg_pool2d"]


def test_difference_2_relu6_shares_qparams():
    model = Fn(lambda m, x: F.relu6(m.conv(x)), conv=nn.Conv2d(3, 4, 3))
    ours, peer = annotate_both(model, img(), ours_quantizer(), peer_quantizer())
    assert ours["relu6"] == ({"conv2d": ("shared", "conv2d")}, ("shared", "conv2d"))
    assert "relu6" not in peer
    assert ours["conv2d"] == peer["conv2d"]


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        self.fc = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


@pytest.mark.parametrize("setter", ["set_module_name", "set_module_type"])
def test_difference_3_module_configs_reach_conv_and_linear_relu(setter):
    config = {"is_per_channel": True}
    ours, peer = qx.XNNPACKQuantizer(), xq.XNNPACKQuantizer()
    if setter == "set_module_name":
        ours.set_module_name("conv", qx.get_symmetric_quantization_config(**config))
        peer.set_module_name("conv", xq.get_symmetric_quantization_config(**config))
    else:
        ours.set_module_type(nn.Conv2d, qx.get_symmetric_quantization_config(**config))
        peer.set_module_type(nn.Conv2d, xq.get_symmetric_quantization_config(**config))
    ours_ann, peer_ann = annotate_both(Blocks(), img(), ours, peer)
    assert "conv2d" in ours_ann and "relu" in ours_ann  # conv + relu, anchored on the conv
    assert "conv2d" not in peer_ann
    assert "linear" not in ours_ann and "linear" not in peer_ann


def test_difference_4_operator_type_config_applies_to_that_op_only():
    model = Fn(lambda m, x, s: (m.c2(x), m.c1(s)), c2=nn.Conv2d(3, 4, 3), c1=nn.Conv1d(3, 4, 3))
    inputs = (torch.randn(1, 3, 8, 8), torch.randn(1, 3, 10))
    ours = qx.XNNPACKQuantizer().set_operator_type(aten.conv2d.default, qx.get_symmetric_quantization_config())
    peer = xq.XNNPACKQuantizer().set_operator_type(aten.conv2d.default, xq.get_symmetric_quantization_config())
    ours_ann, peer_ann = annotate_both(model, inputs, ours, peer)
    assert "conv2d" in ours_ann and "conv2d" in peer_ann
    assert "conv1d" not in ours_ann and "conv1d" in peer_ann


def test_difference_5_integer_scalar_operands_are_left_alone():
    model = Fn(lambda m, x, i: x * (i + 1))
    inputs = (torch.randn(4), torch.arange(4))
    exported = torch.export.export(model, inputs).module()
    ours = ours_quantizer().transform_for_annotation(exported)
    peer = peer_quantizer().transform_for_annotation(torch.export.export(model, inputs).module())

    def int_add_dtype(gm):
        (add,) = [n for n in gm.graph.nodes if n.target == aten.add.Tensor]
        return add.args[1], gm(*inputs).dtype

    assert int_add_dtype(ours) == (1, torch.float32)
    other, _ = int_add_dtype(peer)
    assert isinstance(other, torch.fx.Node)  # 1 became a float32 buffer: i + 1 is now float
    assert peer.get_buffer(other.target).dtype == torch.float32


def test_difference_6_cat_respects_the_filter_function():
    model = Fn(lambda m, x: torch.cat([m.a(x), m.b(x)], 1), a=nn.Conv2d(3, 2, 1), b=nn.Conv2d(3, 2, 1))

    def not_cat(node):
        return node.target != aten.cat.default

    ours = ours_quantizer().set_filter_function(not_cat)
    peer = peer_quantizer().set_filter_function(not_cat)
    ours_ann, peer_ann = annotate_both(model, img(), ours, peer)
    assert "cat" not in ours_ann and "cat" in peer_ann
    assert ours_ann["conv2d"] == peer_ann["conv2d"]


def test_none_module_name_config_is_accepted_by_us_only():
    with pytest.raises(AssertionError):
        xq.XNNPACKQuantizer().set_module_name("conv", None)
    ours = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config()).set_module_name("conv", None)
    ours_ann, _ = annotate_both(Blocks(), img(), ours, peer_quantizer())
    assert "conv2d" not in ours_ann and "linear" in ours_ann

"""Hosting ExecuTorch 1.5.1's own XNNPACKQuantizer, unmodified (issue #21), tox env ``xnnpack``.

``executorch.backends.xnnpack.quantizer.xnnpack_quantizer.XNNPACKQuantizer`` is written
against torchao's PT2E classes. Run through quantweave's prepare / calibrate / convert, it
gives the converted model torchao's prepare_pt2e / convert_pt2e give with the same
quantizer: same number of quantize / dequantize nodes, same q/dq decisions, max abs
difference 0 -- on conv-bn-relu, an MLP and an attention block, in the static per-tensor,
static per-channel and dynamic configurations, and after QAT (decisions compared as a
multiset: torchao renames the conv nodes it rewrites). Before issue #21 it failed at
prepare with ``KeyError: 'val'`` (batch-norm folding left weight nodes without meta["val"])
and, once annotated, converted to a float model with no q/dq node.
"""

import pytest
import torch
from torch import nn

import quantweave as qw
from quantweave.convert import dequantize_ops, quantize_ops
from quantweave.plugin_api import ANNOTATED_BY_KEY
from quantweave.testing import models
from quantweave.testing.inspect import qdq_summary

from ._cases import CONFIGS, example_inputs, peer_flow, peer_run, run_flow

pytestmark = pytest.mark.executorch
xq = pytest.importorskip(
    "executorch.backends.xnnpack.quantizer.xnnpack_quantizer", reason="needs ExecuTorch 1.5.1 (tox -e xnnpack)"
)
pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")  # the peer flows (_cases.peer_run)


class ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class MLP(nn.Module):
    """Over the last dimension of the shared cases' image inputs (…, 32)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _conv_bn_relu():
    model = ConvBnRelu()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


#: the issue's three models (the ExecuTorch tests' MobileNet-like, transformer and decoder models
#: are compared with quantweave-xnnpack in test_parity_executorch.py)
ALL_MODELS = {
    "conv_bn_relu": _conv_bn_relu,
    "mlp": MLP,
    "attention": lambda: models.encoder_block(),
}


def vendor(config):
    return xq.XNNPACKQuantizer().set_global(xq.get_symmetric_quantization_config(**config))


def qdq_count(gm):
    ops = (*quantize_ops(), *dequantize_ops())
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in ops)


def flows(model_name, config_name):
    config = CONFIGS[config_name]
    torch.manual_seed(0)
    ours = run_flow(ALL_MODELS[model_name](), config, vendor(config))
    if model_name == "attention":  # the parity tests' transformer block: torchao's flow made once per session
        return ours, peer_flow("transformer_block", config_name)
    torch.manual_seed(0)
    theirs = peer_run(ALL_MODELS[model_name](), config, vendor(config))
    return ours, theirs


CASES = [(m, c) for m in ALL_MODELS for c in CONFIGS]


@pytest.mark.parametrize(("model_name", "config_name"), CASES)
def test_executorch_xnnpack_quantizer_through_quantweave_equals_torchao(model_name, config_name):
    config = CONFIGS[config_name]
    (_, ours), (_, theirs) = flows(model_name, config_name)
    assert qdq_count(ours) == qdq_count(theirs)
    # XNNPACK's dynamic configuration quantizes linear only: a conv model stays float on both sides
    assert qdq_count(ours) > 0 or (config.get("is_dynamic") and model_name == "conv_bn_relu")
    if config.get("is_qat"):
        assert sorted(map(repr, qdq_summary(ours).values())) == sorted(map(repr, qdq_summary(theirs).values()))
    else:
        assert qdq_summary(ours) == qdq_summary(theirs)
    torch.manual_seed(1)
    inputs = example_inputs(ALL_MODELS[model_name](), config)
    out, ref = ours(*inputs), theirs(*inputs)
    assert torch.equal(out, ref), f"max abs difference {(out - ref).abs().max().item()}"


def test_exported_without_the_guards_node_too():
    model = _conv_bn_relu().eval()
    inputs = (torch.randn(1, 3, 16, 16),)
    config = CONFIGS["static_per_channel"]
    results = []
    for check_guards in (True, False):
        exported = torch.export.export(model, inputs).module(check_guards=check_guards)
        if not check_guards:
            assert not any(n.name == "_guards_fn" for n in exported.graph.nodes)
        prepared = qw.prepare_pt2e(exported, vendor(config))
        prepared(*inputs)
        results.append(qw.convert_pt2e(prepared)(*inputs))
    assert torch.equal(*results)


@pytest.mark.parametrize("order", ["vendor_first", "ours_first"])
def test_executorch_quantizer_composes_with_quantweave_xnnpack(order):
    import quantweave_xnnpack as qx

    model = models.encoder_block().eval()
    inputs = (torch.randn(1, 16, 64),)
    config = CONFIGS["static_per_channel"]
    ours = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(**config))
    members = [vendor(config), ours] if order == "vendor_first" else [ours, vendor(config)]
    composed = qw.ComposableQuantizer(members)
    prepared = qw.prepare_pt2e(torch.export.export(model, inputs).module(), composed)
    prepared(*inputs)
    converted = qw.convert_pt2e(prepared)
    alone = qw.prepare_pt2e(torch.export.export(model, inputs).module(), members[0])
    alone(*inputs)
    alone = qw.convert_pt2e(alone)
    by = {n.meta.get(ANNOTATED_BY_KEY) for n in prepared.graph.nodes} - {None}
    assert by == {composed.labels[0]}  # the first member claims every node it quantizes alone
    assert qdq_count(converted) == qdq_count(alone) > 0
    assert torch.equal(converted(*inputs), alone(*inputs))

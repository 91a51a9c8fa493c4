"""prepare_pt2e folds eval-mode batch norm into conv-transpose and linear, and only there."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import quantweave as qw

aten = torch.ops.aten
BATCH_NORMS = (aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default)


class NoAnnotation(qw.Quantizer):
    """Annotates nothing: the prepared model is the folded float model."""

    def annotate(self, model):
        return model


def batch_norm_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in BATCH_NORMS]


def with_statistics(bn: nn.Module, seed: int = 0) -> nn.Module:
    """Running statistics and affine parameters far from the identity, so a wrong fold shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.running_mean.copy_(torch.rand(bn.num_features, generator=g) * 2 - 1)
        bn.running_var.copy_(torch.rand(bn.num_features, generator=g) * 2 + 0.25)
        bn.weight.copy_(torch.rand(bn.num_features, generator=g) * 2 - 1)
        bn.bias.copy_(torch.rand(bn.num_features, generator=g) * 2 - 1)
    return bn


def prepare_folded(model: nn.Module, x: torch.Tensor):
    exported = torch.export.export(model, (x,)).module()
    prepared = qw.prepare_pt2e(exported, NoAnnotation())
    return exported, prepared


CONV_TRANSPOSE = {
    "2d": (nn.ConvTranspose2d, nn.BatchNorm2d, (2, 4, 5, 5)),
    "2d_groups2": (nn.ConvTranspose2d, nn.BatchNorm2d, (2, 4, 5, 5)),
    "2d_depthwise": (nn.ConvTranspose2d, nn.BatchNorm2d, (2, 4, 5, 5)),
    "1d_groups2": (nn.ConvTranspose1d, nn.BatchNorm1d, (2, 4, 7)),
    "3d_groups2": (nn.ConvTranspose3d, nn.BatchNorm3d, (1, 4, 3, 4, 4)),
}
# case -> (out_channels, groups, stride)
CONV_TRANSPOSE_SHAPE = {
    "2d": (6, 1, 2),
    "2d_groups2": (6, 2, 2),
    "2d_depthwise": (4, 4, 1),
    "1d_groups2": (8, 2, 1),
    "3d_groups2": (6, 2, 1),
}


@pytest.mark.parametrize("case", sorted(CONV_TRANSPOSE))
@pytest.mark.parametrize("bias", [True, False])
def test_eval_batch_norm_after_conv_transpose_is_folded(case, bias):
    conv_cls, bn_cls, shape = CONV_TRANSPOSE[case]
    out_channels, groups, stride = CONV_TRANSPOSE_SHAPE[case]
    model = nn.Sequential(
        conv_cls(shape[1], out_channels, 3, stride=stride, groups=groups, bias=bias),
        with_statistics(bn_cls(out_channels)),
    ).eval()
    x = torch.randn(*shape)
    exported, prepared = prepare_folded(model, x)
    assert batch_norm_nodes(exported), "the exported model has a batch norm to fold"
    assert not batch_norm_nodes(prepared), f"batch norm left after {case}: {prepared.graph}"
    torch.testing.assert_close(prepared(x), model(x), rtol=0, atol=1e-5)
    assert batch_norm_nodes(exported), "the caller's graph keeps its batch norm"
    torch.testing.assert_close(exported(x), model(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
def test_eval_batch_norm_after_linear_on_2d_input_is_folded(bias):
    model = nn.Sequential(nn.Linear(8, 6, bias=bias), with_statistics(nn.BatchNorm1d(6))).eval()
    x = torch.randn(5, 8)
    exported, prepared = prepare_folded(model, x)
    assert batch_norm_nodes(exported)
    assert not batch_norm_nodes(prepared), str(prepared.graph)
    torch.testing.assert_close(prepared(x), model(x), rtol=0, atol=1e-5)


class LinearOver3d(nn.Module):
    """Linear over the last axis of (N, C, L), BatchNorm1d over C: the BN normalises an axis
    the linear's weight does not own, so folding it would be wrong (C == L, so a wrong fold
    would not even fail on shapes)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(7, 7)
        self.bn = with_statistics(nn.BatchNorm1d(7))

    def forward(self, x):
        return self.bn(self.fc(x))


def test_batch_norm_after_linear_on_3d_input_is_left_unfolded():
    model = LinearOver3d().eval()
    x = torch.randn(2, 7, 7)
    _, prepared = prepare_folded(model, x)
    assert len(batch_norm_nodes(prepared)) == 1, str(prepared.graph)
    torch.testing.assert_close(prepared(x), model(x), rtol=0, atol=1e-6)


def test_training_mode_batch_norm_is_left_unfolded():
    model = nn.Sequential(nn.ConvTranspose2d(3, 4, 3), with_statistics(nn.BatchNorm2d(4))).train()
    x = torch.randn(2, 3, 5, 5)
    _, prepared = prepare_folded(model, x)
    (bn,) = batch_norm_nodes(prepared)
    assert bn.args[5] is True, "still normalising with batch statistics"
    assert not [name for name, _ in prepared.named_parameters() if "folded" in name]
    torch.testing.assert_close(prepared(x), model(x), rtol=0, atol=1e-5)


class ConvOutputUsedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = with_statistics(nn.BatchNorm2d(4))

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


def test_batch_norm_is_not_folded_when_the_conv_output_has_other_users():
    model = ConvOutputUsedTwice().eval()
    x = torch.randn(1, 3, 6, 6)
    _, prepared = prepare_folded(model, x)
    assert len(batch_norm_nodes(prepared)) == 1, str(prepared.graph)
    torch.testing.assert_close(prepared(x), model(x), rtol=0, atol=1e-6)


def test_folding_drops_the_batch_norm_parameters_from_the_prepared_graph():
    model = nn.Sequential(nn.ConvTranspose2d(4, 6, 3, groups=2), with_statistics(nn.BatchNorm2d(6))).eval()
    _, prepared = prepare_folded(model, torch.randn(1, 4, 5, 5))
    targets = {str(n.target) for n in prepared.graph.nodes if n.op == "get_attr"}
    assert all(t.startswith("_folded_") for t in targets), targets
    assert len(targets) == 2, targets

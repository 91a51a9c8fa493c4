"""The core vocabulary: the patterns quantweave itself names, with their producers and probes.

The core registers them through the same ``quantweave_patterns`` hook plugins use (see
:mod:`quantweave._modules.core_plugin`, which the registry always loads); a plugin's pattern
of a core name is ignored with a warning.
"""

from __future__ import annotations

import functools

from .probes import PROBES
from .spec import PatternSpec, Vocabulary

__all__ = ["PATTERNS", "PRODUCERS", "core_patterns", "core_vocabulary"]

#: The pattern vocabulary: canonical name -> (description, the aten ops that anchor it).
#: The ops are what a quantizer is expected to annotate for the pattern.
PATTERNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "conv1d": ("1-D convolution", ("aten.conv1d.default",)),
    "conv1d_relu": ("1-D convolution followed by relu", ("aten.conv1d.default", "aten.relu.default")),
    "conv2d": ("2-D convolution", ("aten.conv2d.default",)),
    "conv2d_relu": ("2-D convolution followed by relu", ("aten.conv2d.default", "aten.relu.default")),
    "conv2d_hardtanh": ("2-D convolution followed by hardtanh", ("aten.conv2d.default", "aten.hardtanh.default")),
    "conv2d_relu6": (
        "2-D convolution followed by relu6",
        ("aten.conv2d.default", "aten.relu6.default", "aten.hardtanh.default"),
    ),
    "conv2d_hardswish": ("2-D convolution followed by hardswish", ("aten.conv2d.default", "aten.hardswish.default")),
    "conv2d_silu": ("2-D convolution followed by silu", ("aten.conv2d.default", "aten.silu.default")),
    "conv2d_add": (
        "2-D convolution whose output is added to another tensor",
        ("aten.conv2d.default", "aten.add.Tensor"),
    ),
    "conv2d_add_relu": (
        "2-D convolution, add, relu",
        ("aten.conv2d.default", "aten.add.Tensor", "aten.relu.default"),
    ),
    "conv2d_bn": (
        "2-D convolution followed by batch norm (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default"),
    ),
    "conv2d_bn_relu": (
        "2-D convolution, batch norm, relu (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.relu.default"),
    ),
    "conv2d_bn_hardtanh": (
        "2-D convolution, batch norm, hardtanh (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.hardtanh.default"),
    ),
    "conv2d_bn_relu6": (
        "2-D convolution, batch norm, relu6 (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.relu6.default", "aten.hardtanh.default"),
    ),
    "conv2d_bn_hardswish": (
        "2-D convolution, batch norm, hardswish (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.hardswish.default"),
    ),
    "conv2d_bn_silu": (
        "2-D convolution, batch norm, silu (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.silu.default"),
    ),
    "conv2d_bn_add": (
        "2-D convolution, batch norm, add of another tensor (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.add.Tensor"),
    ),
    "conv2d_bn_add_relu": (
        "2-D convolution, batch norm, add, relu (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.add.Tensor", "aten.relu.default"),
    ),
    "conv_transpose2d": ("2-D transposed convolution", ("aten.conv_transpose2d.input",)),
    "conv_transpose2d_relu": (
        "2-D transposed convolution followed by relu",
        ("aten.conv_transpose2d.input", "aten.relu.default"),
    ),
    "conv_transpose2d_bn": (
        "2-D transposed convolution followed by batch norm (QAT)",
        ("aten.conv_transpose2d.input", "aten.batch_norm.default"),
    ),
    "conv_transpose2d_bn_relu": (
        "2-D transposed convolution, batch norm, relu (QAT)",
        ("aten.conv_transpose2d.input", "aten.batch_norm.default", "aten.relu.default"),
    ),
    "linear": ("fully connected layer", ("aten.linear.default",)),
    "linear_relu": ("linear followed by relu", ("aten.linear.default", "aten.relu.default")),
    "linear_leaky_relu": ("linear followed by leaky_relu", ("aten.linear.default", "aten.leaky_relu.default")),
    "linear_tanh": ("linear followed by tanh", ("aten.linear.default", "aten.tanh.default")),
    "linear_gelu": ("linear followed by gelu", ("aten.linear.default", "aten.gelu.default")),
    "linear_add": ("linear whose output is added to another tensor", ("aten.linear.default", "aten.add.Tensor")),
    "linear_add_relu": ("linear, add, relu", ("aten.linear.default", "aten.add.Tensor", "aten.relu.default")),
    "matmul": ("matrix product of two activations", ("aten.matmul.default",)),
    "addmm": (
        "bias plus an activation times a constant [in, out] weight: a linear (GPT-2's Conv1D)",
        ("aten.addmm.default",),
    ),
    "mm": ("an activation times a constant [in, out] weight: a linear without bias", ("aten.mm.default",)),
    "matmul_weight": (
        "an activation times a constant [in, out] weight, written x @ W: a linear without bias",
        ("aten.matmul.default",),
    ),
    "add": ("elementwise add of two tensors", ("aten.add.Tensor",)),
    "add_relu": ("add followed by relu", ("aten.add.Tensor", "aten.relu.default")),
    "mul": ("elementwise multiply of two tensors", ("aten.mul.Tensor",)),
    "mul_relu": ("multiply followed by relu", ("aten.mul.Tensor", "aten.relu.default")),
    "cat": ("concatenation (probe: two convs into cat)", ("aten.cat.default",)),
    "max_pool2d": ("2-D max pooling", ("aten.max_pool2d.default",)),
    "avg_pool2d": ("2-D average pooling", ("aten.avg_pool2d.default",)),
    "adaptive_avg_pool2d": ("2-D adaptive average pooling", ("aten.adaptive_avg_pool2d.default",)),
    "flatten": ("flatten (probe: conv → flatten → linear)", ("aten.flatten.using_ints",)),
    "mean": ("mean over dimensions (probe: conv → mean over H, W)", ("aten.mean.dim",)),
    "permute": ("permute (probe: conv → permute)", ("aten.permute.default",)),
    "transpose": ("transpose (probe: conv → transpose)", ("aten.transpose.int",)),
    "view": ("view (probe: conv → view)", ("aten.view.default",)),
    "reshape": ("reshape (probe: conv → reshape)", ("aten.reshape.default",)),
    "squeeze": ("squeeze of a dimension (probe: conv → squeeze)", ("aten.squeeze.dim",)),
    "slice": ("slice along a dimension (probe: conv → channel slice)", ("aten.slice.Tensor",)),
    "dropout": ("dropout (kept by export; identity in eval) (probe: conv → dropout)", ("aten.dropout.default",)),
    "relu": ("relu on its own, not fused (probe: two convs → cat → relu)", ("aten.relu.default",)),
    "hardtanh": ("hardtanh on its own, not fused (probe: two convs → cat → hardtanh)", ("aten.hardtanh.default",)),
    "relu6": ("relu6 on its own, not fused (probe: two convs → cat → relu6)", ("aten.relu6.default",)),
    "sigmoid": ("sigmoid (fixed output qparams)", ("aten.sigmoid.default",)),
    "softmax": ("softmax (fixed output qparams)", ("aten.softmax.int",)),
    "embedding": ("embedding table lookup (weight)", ("aten.embedding.default",)),
}

#: pattern -> the pattern feeding its anchor in the core probe (ops quantized only after a
#: quantized producer are probed behind a conv; activations on their own behind a cat, which
#: no backend fuses them with)
PRODUCERS: dict[str, str] = {
    **dict.fromkeys(("relu", "hardtanh", "relu6"), "cat"),
    **dict.fromkeys(
        (
            "cat",
            "max_pool2d",
            "avg_pool2d",
            "adaptive_avg_pool2d",
            "flatten",
            "mean",
            "permute",
            "transpose",
            "view",
            "reshape",
            "squeeze",
            "slice",
            "dropout",
        ),
        "conv2d",
    ),
}


def core_patterns() -> dict[str, PatternSpec]:
    """The core vocabulary as :class:`PatternSpec` records (a new dict each call), probes and
    producers included."""
    return dict(core_vocabulary())


@functools.cache
def core_vocabulary() -> Vocabulary:
    """The core patterns as one (immutable) :class:`Vocabulary`."""
    return Vocabulary(
        PatternSpec(name, description, ops, PROBES.get(name), producer=PRODUCERS.get(name))
        for name, (description, ops) in PATTERNS.items()
    )

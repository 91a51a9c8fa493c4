"""The aten ops of ONNX Runtime's recipe, by the treatment the quantizer gives them."""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten

_RELU = (aten.relu.default, aten.relu_.default)
_CLIP = (aten.hardtanh.default, aten.hardtanh_.default, aten.relu6.default)
#: weighted op -> the activations folded into its output range
_WEIGHTED: dict[Any, tuple[Any, ...]] = {
    aten.conv1d.default: _RELU,
    aten.conv2d.default: _RELU + _CLIP,
    aten.conv_transpose2d.input: _RELU,
    aten.linear.default: _RELU,
    # padding="same" / "valid": the same convolution (ONNX Conv takes the padding either way)
    aten.conv1d.padding: _RELU,
    aten.conv2d.padding: _RELU + _CLIP,
}
_TRANSPOSED = (aten.conv_transpose2d.input,)
_BINARY = (aten.add.Tensor, aten.mul.Tensor)
_MATMUL = (aten.matmul.default,)
_CAT = (aten.cat.default,)
_SHARED = (
    aten.max_pool2d.default,
    aten.flatten.using_ints,
    aten.view.default,
    aten.reshape.default,
    aten.permute.default,
    aten.transpose.int,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.dropout.default,
    aten.upsample_nearest2d.vec,
    aten.upsample_bilinear2d.vec,
)
_SPLIT = (aten.split.Tensor,)
_UNARY_OWN = (aten.sigmoid.default, aten.softmax.int)
_BATCH_NORM = aten.batch_norm.default
_AVERAGING = (aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default)
#: every op of the recipe (what a config of None claims and leaves float)
_RECIPE_OPS = frozenset(
    (*_WEIGHTED, *_BINARY, *_MATMUL, *_CAT, *_SHARED, *_SPLIT, *_UNARY_OWN, *_AVERAGING, _BATCH_NORM)
)
_DYNAMIC_OPS = frozenset((aten.linear.default, *_MATMUL))

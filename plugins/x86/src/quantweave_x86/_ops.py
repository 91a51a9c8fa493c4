"""The aten ops x86's recipe matches, and the torch callables / modules its setters accept."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

aten = torch.ops.aten

CONV2D = aten.conv2d.default
CONV1D = aten.conv1d.default
LINEAR = aten.linear.default
BATCH_NORM = aten.batch_norm.default
MUL = aten.mul.Tensor
MATMUL = aten.matmul.default
CAT = aten.cat.default
FLATTEN = aten.flatten.using_ints
#: convs with a string padding ("same" / "valid") -> the conv they are rewritten as
PADDING_CONVS: dict[Any, Any] = {aten.conv1d.padding: CONV1D, aten.conv2d.padding: CONV2D}
ADD = (aten.add.Tensor,)
RELU = (aten.relu.default, aten.relu_.default)
CONV_UNARY = (
    *RELU,
    aten.hardtanh.default,
    aten.hardtanh_.default,
    aten.relu6.default,
    aten.hardswish.default,
    aten.hardswish_.default,
    aten.silu.default,
    aten.silu_.default,
)
LINEAR_UNARY = (*RELU, aten.leaky_relu.default, aten.tanh.default, aten.gelu.default)
PROPAGATE = (aten.max_pool2d.default, CAT, aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default, FLATTEN)
WEIGHTED_OPS = (CONV1D, CONV2D, LINEAR)
# what the global config quantizes (matmul is opt-in)
DEFAULT_QUANTIZABLE = frozenset((CONV1D, CONV2D, LINEAR, MUL, *PROPAGATE))
QUANTIZABLE = DEFAULT_QUANTIZABLE | {MATMUL}

# torch callables / modules accepted by set_function_type_qconfig / set_module_type_qconfig
OPERATOR_OF: dict[Any, Any] = {
    torch.nn.Conv1d: CONV1D,
    F.conv1d: CONV1D,
    torch.nn.Conv2d: CONV2D,
    F.conv2d: CONV2D,
    torch.nn.Linear: LINEAR,
    F.linear: LINEAR,
    torch.nn.MaxPool2d: aten.max_pool2d.default,
    F.max_pool2d: aten.max_pool2d.default,
    torch.cat: CAT,
    torch.nn.AvgPool2d: aten.avg_pool2d.default,
    F.avg_pool2d: aten.avg_pool2d.default,
    torch.nn.AdaptiveAvgPool2d: aten.adaptive_avg_pool2d.default,
    F.adaptive_avg_pool2d: aten.adaptive_avg_pool2d.default,
    torch.flatten: FLATTEN,
    torch.matmul: MATMUL,
    torch.addmm: aten.addmm.default,
    torch.mm: aten.mm.default,
    torch.mul: MUL,
}

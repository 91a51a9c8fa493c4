"""Where aten's batch-norm ops keep their arguments: one table for BN folding (PTQ and
QAT) and for switching an exported model between train and eval."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.fx import Node

__all__ = ["BATCH_NORM_TRAINING_ARG", "BatchNormCall", "batch_norm_call"]

aten = torch.ops.aten


class _Positions(NamedTuple):
    training: int | None  # None: the op is eval-only
    eps: int


# Both take (input, weight, bias, running_mean, running_var) first:
#   aten.batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled)
#   aten._native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps)
#: index of ``training`` in ``aten.batch_norm.default``'s arguments
BATCH_NORM_TRAINING_ARG = 5
_POSITIONS = {
    aten.batch_norm.default: _Positions(training=BATCH_NORM_TRAINING_ARG, eps=7),
    aten._native_batch_norm_legit_no_training.default: _Positions(training=None, eps=6),
}


class BatchNormCall(NamedTuple):
    """The arguments of one batch-norm node, by name (graph nodes or literals)."""

    input: Any
    weight: Any
    bias: Any
    running_mean: Any
    running_var: Any
    training: bool
    eps: float


def batch_norm_call(node: Node, targets: tuple[Any, ...] | None = None) -> BatchNormCall | None:
    """The named arguments of ``node`` if it calls a batch-norm op (one of ``targets``, by
    default any known one) with positional arguments; None otherwise."""
    if node.op != "call_function" or node.target not in _POSITIONS:
        return None
    if targets is not None and node.target not in targets:
        return None
    positions = _POSITIONS[node.target]
    args = node.args
    if len(args) <= max(positions.eps, positions.training or 0):
        return None
    training = False if positions.training is None else bool(args[positions.training])
    eps = float(args[positions.eps])  # type: ignore[arg-type,unused-ignore]
    return BatchNormCall(args[0], args[1], args[2], args[3], args[4], training, eps)

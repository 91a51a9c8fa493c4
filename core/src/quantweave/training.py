"""Switch an exported (or QAT-prepared) model between training and evaluation behaviour.

``model.eval()`` / ``model.train()`` do nothing useful on the output of
``torch.export.export(...).module()``: the mode of batch norm and dropout was traced into
the graph as an argument. These functions rewrite that argument, in place, like
``nn.Module.train()`` changes a module (same names as the PT2E helpers, so code ports by
changing imports). Typical use: evaluate a QAT-prepared model between training epochs.
"""

from __future__ import annotations

import types

import torch
from torch.fx import GraphModule

from ._modules.batch_norm import BATCH_NORM_TRAINING_ARG
from ._modules.graph import check_graph_module

__all__ = [
    "allow_exported_model_train_eval",
    "disallow_eval_train",
    "move_exported_model_to_eval",
    "move_exported_model_to_train",
]

aten = torch.ops.aten
# op -> index of its "training" argument
_MODE_ARGUMENT = {
    aten.batch_norm.default: BATCH_NORM_TRAINING_ARG,
    aten.dropout.default: 2,
    aten.feature_dropout.default: 2,
    aten.alpha_dropout.default: 2,
    aten.feature_alpha_dropout.default: 2,
}


def _set_mode(model: GraphModule, training: bool, api: str) -> GraphModule:
    check_graph_module(model, api)
    changed = False
    for node in model.graph.nodes:
        index = _MODE_ARGUMENT.get(node.target) if node.op == "call_function" else None
        if index is None or len(node.args) <= index or node.args[index] == training:
            continue
        args = list(node.args)
        args[index] = training
        node.args = tuple(args)
        changed = True
    if changed:
        model.recompile()
    model.training = training
    return model


def move_exported_model_to_eval(model: GraphModule) -> GraphModule:
    """Batch norm normalises with running statistics and dropout is off; returns ``model``."""
    return _set_mode(model, False, "move_exported_model_to_eval")


def move_exported_model_to_train(model: GraphModule) -> GraphModule:
    """Batch norm uses (and updates) batch statistics and dropout is on; returns ``model``."""
    return _set_mode(model, True, "move_exported_model_to_train")


_EVAL_TRAIN_MESSAGE = (
    "{call}() on an exported, prepared or converted model does not switch batch norm or dropout "
    "(their mode is an argument in the graph): call quantweave.move_exported_model_to_eval(model) / "
    "quantweave.move_exported_model_to_train(model) instead, or quantweave.allow_exported_model_train_eval(model) "
    "once to make {call}() do that"
)


def _no_train(self: GraphModule, mode: bool = True) -> GraphModule:
    raise NotImplementedError(_EVAL_TRAIN_MESSAGE.format(call="train"))


def _no_eval(self: GraphModule) -> GraphModule:
    raise NotImplementedError(_EVAL_TRAIN_MESSAGE.format(call="eval"))


def disallow_eval_train(model: GraphModule) -> GraphModule:
    """Make ``model.eval()`` / ``model.train()`` raise NotImplementedError pointing at
    :func:`move_exported_model_to_eval` / :func:`move_exported_model_to_train` (as
    ``torch.export``'s modules and torchao's prepared / converted models do); returns ``model``."""
    model.train = types.MethodType(_no_train, model)  # type: ignore[method-assign]
    model.eval = types.MethodType(_no_eval, model)  # type: ignore[method-assign]
    return model


def _train_by_rewrite(self: GraphModule, mode: bool = True) -> GraphModule:
    return _set_mode(self, mode, "train")


def _eval_by_rewrite(self: GraphModule) -> GraphModule:
    return _set_mode(self, False, "eval")


def allow_exported_model_train_eval(model: GraphModule) -> GraphModule:
    """Make ``model.eval()`` / ``model.train(mode)`` rewrite batch norm and dropout as
    :func:`move_exported_model_to_eval` / :func:`move_exported_model_to_train` do (same name
    and effect as torchao's helper); returns ``model``."""
    check_graph_module(model, "allow_exported_model_train_eval")
    model.train = types.MethodType(_train_by_rewrite, model)  # type: ignore[method-assign]
    model.eval = types.MethodType(_eval_by_rewrite, model)  # type: ignore[method-assign]
    return model

"""Fold eval-mode batch norm into the preceding conv / conv-transpose / linear."""

from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

from .graph import get_attr_value, new_attr_name

aten = torch.ops.aten

_CONV = {
    aten.conv1d.default: False,
    aten.conv2d.default: False,
    aten.conv3d.default: False,
    aten.conv_transpose1d.default: True,
    aten.conv_transpose2d.input: True,
    aten.conv_transpose3d.input: True,
}
_LINEAR = aten.linear.default
# target -> (index of "training" arg or None, index of eps)
_BN = {
    aten.batch_norm.default: (5, 7),
    aten._native_batch_norm_legit_no_training.default: (None, 6),
}


def _param(model: GraphModule, node: object) -> torch.Tensor | None:
    if node is None:
        return None
    if not isinstance(node, Node) or node.op != "get_attr":
        raise LookupError
    value = get_attr_value(model, str(node.target))
    if not isinstance(value, torch.Tensor):
        raise LookupError
    return value


def _bn_output(bn: Node) -> Node | None:
    """The node producing the normalised tensor: bn itself or its getitem(0)."""
    if bn.target is aten.batch_norm.default:
        return bn
    users = list(bn.users)
    if len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0:
        return users[0]
    return None


def fold_batch_norm(model: GraphModule) -> int:
    """Fold every eval-mode BN that directly follows a conv or linear owning its output.

    The folded weight/bias are new attributes; the originals are left untouched (they may
    be shared with the caller's model). Returns how many BNs were folded.
    """
    folded = 0
    for bn in list(model.graph.nodes):
        if bn.op != "call_function" or bn.target not in _BN:
            continue
        training_index, eps_index = _BN[bn.target]
        if training_index is not None and bn.args[training_index]:
            continue  # a training-mode BN is not foldable
        producer = bn.args[0]
        if not isinstance(producer, Node) or producer.op != "call_function":
            continue
        if producer.target not in _CONV and producer.target is not _LINEAR:
            continue
        if len(producer.users) != 1:
            continue  # the un-normalised output is used elsewhere
        out = _bn_output(bn)
        if out is None:
            continue
        try:
            weight = _param(model, producer.args[1])
            bias = _param(model, producer.args[2] if len(producer.args) > 2 else None)
            bn_w = _param(model, bn.args[1])
            bn_b = _param(model, bn.args[2])
            mean = _param(model, bn.args[3])
            var = _param(model, bn.args[4])
        except LookupError:
            continue
        if weight is None or mean is None or var is None:
            continue
        eps = float(bn.args[eps_index])  # type: ignore[arg-type,unused-ignore]
        with torch.no_grad():
            if producer.target is _LINEAR:
                if bn_w is None or bn_b is None or weight.dim() != 2:
                    continue
                val = producer.meta.get("val")
                if val is not None and val.dim() != 2:
                    continue  # BN over a non-2-D linear output normalises another axis
                new_w, new_b = fuse_linear_bn_weights(weight, bias, mean, var, eps, bn_w, bn_b)
            else:
                new_w, new_b = fuse_conv_bn_weights(
                    weight, bias, mean, var, eps, bn_w, bn_b, transpose=_CONV[producer.target]
                )
        w_name = new_attr_name(model, "_folded_weight_")
        model.register_parameter(w_name, torch.nn.Parameter(new_w.detach(), requires_grad=False))
        b_name = new_attr_name(model, "_folded_bias_")
        model.register_parameter(b_name, torch.nn.Parameter(new_b.detach(), requires_grad=False))
        with model.graph.inserting_before(producer):
            w_node = model.graph.get_attr(w_name)
            b_node = model.graph.get_attr(b_name)
        args = list(producer.args)
        args[1] = w_node
        if len(args) > 2:
            args[2] = b_node
        else:
            args.append(b_node)
        producer.args = tuple(args)
        out.replace_all_uses_with(producer)
        for node in (out, bn):
            if not node.users and node in model.graph.nodes:
                model.graph.erase_node(node)
        folded += 1
    if folded:
        _drop_unused_get_attrs(model)
        model.recompile()
    return folded


def _drop_unused_get_attrs(model: GraphModule) -> None:
    for node in list(model.graph.nodes):
        if node.op == "get_attr" and not node.users:
            model.graph.erase_node(node)

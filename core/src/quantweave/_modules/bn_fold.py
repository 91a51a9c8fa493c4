"""Fold eval-mode batch norm into the preceding conv / conv-transpose / linear."""

from __future__ import annotations

import operator
import warnings

import torch
from torch.fx import GraphModule, Node
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

from .batch_norm import batch_norm_call
from .graph import erase_dead, get_attr_value, new_attr_name
from .torch_compat import fake_value

aten = torch.ops.aten

# conv target -> (is transposed, index of its "groups" argument)
_CONV = {
    aten.conv1d.default: (False, 6),
    aten.conv2d.default: (False, 6),
    aten.conv3d.default: (False, 6),
    # conv with string padding ("same" / "valid"): the same argument positions
    aten.conv1d.padding: (False, 6),
    aten.conv2d.padding: (False, 6),
    aten.conv3d.padding: (False, 6),
    # conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation)
    aten.conv_transpose1d.default: (True, 6),
    aten.conv_transpose2d.input: (True, 6),
    aten.conv_transpose3d.input: (True, 6),
}
_LINEAR = aten.linear.default


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


def _warn_linear_bn_not_fused(linear: Node, bn: Node, dim: int) -> None:
    """Batch norm after a linear with a 3-D (or wider) output normalises dimension 1, which is
    not the linear's output-feature dimension: folding would be wrong, so it is left (as torchao
    does, with a warning naming both nodes)."""
    warnings.warn(
        f"Not fusing linear+bn: {linear.name!r} has a {dim}-D output, and batch norm {bn.name!r} normalises "
        "its dimension 1, not the linear's output features; the batch norm is left unfolded",
        UserWarning,
        stacklevel=4,
    )


def _port_fold_meta(producer: Node, nodes: tuple[Node, ...]) -> None:
    """The folded weight / bias ``get_attr`` nodes take the source location of the layer they
    belong to (so every node of a prepared model carries meta, as after export)."""
    for node in nodes:
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in producer.meta and key not in node.meta:
                node.meta[key] = producer.meta[key]


def _fold_into_conv(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    bn: tuple[torch.Tensor, torch.Tensor, float, torch.Tensor | None, torch.Tensor | None],
    transpose: bool,
    groups: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv's weight and bias with ``bn = (mean, var, eps, bn_weight, bn_bias)`` folded in."""
    if not transpose or groups == 1:
        return fuse_conv_bn_weights(weight, bias, *bn, transpose=transpose)
    # A grouped transposed conv's weight is (in, out / groups, *kernel): output channel
    # g * (out / groups) + j is column j of group g's rows. Lay the output channels out
    # along dim 1 in that order, fold, and put the weight back.
    cin, per_group, *kernel = weight.shape
    by_output = weight.reshape(groups, cin // groups, per_group, *kernel).transpose(0, 1)
    fused_w, new_b = fuse_conv_bn_weights(
        by_output.reshape(cin // groups, groups * per_group, *kernel), bias, *bn, transpose=True
    )
    new_w = fused_w.reshape(cin // groups, groups, per_group, *kernel).transpose(0, 1).reshape(weight.shape)
    return new_w, new_b


def _describe_param(model: GraphModule, node: Node, value: torch.Tensor, like: list[Node]) -> None:
    """meta["val"] of a new parameter node as torch.export records it (a FakeTensor), and the
    stack trace / module stack of the parameter node it replaces (vendors' quantizers read them)."""
    val = fake_value(model.graph, value)
    if val is not None:
        node.meta["val"] = val
    for key in ("stack_trace", "nn_module_stack"):
        if like and key in like[0].meta:
            node.meta[key] = like[0].meta[key]


def fold_batch_norm(model: GraphModule) -> int:
    """Fold every eval-mode BN that directly follows a conv or linear owning its output.

    The folded weight/bias are new attributes; the originals are left untouched (they may
    be shared with the caller's model). Returns how many BNs were folded.
    """
    folded = 0
    for bn in list(model.graph.nodes):
        call = batch_norm_call(bn)
        if call is None or call.training:
            continue  # not a batch norm, or a training-mode one (not foldable)
        producer = call.input
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
            bn_w = _param(model, call.weight)
            bn_b = _param(model, call.bias)
            mean = _param(model, call.running_mean)
            var = _param(model, call.running_var)
        except LookupError:
            continue
        if weight is None or mean is None or var is None:
            continue
        new_w: torch.Tensor
        new_b: torch.Tensor
        with torch.no_grad():
            if producer.target is _LINEAR:
                if bn_w is None or bn_b is None or weight.dim() != 2:
                    continue
                val = producer.meta.get("val")
                if val is not None and val.dim() != 2:
                    _warn_linear_bn_not_fused(producer, bn, val.dim())
                    continue  # BN over a non-2-D linear output normalises another axis
                new_w, new_b = fuse_linear_bn_weights(weight, bias, mean, var, call.eps, bn_w, bn_b)
            else:
                transpose, groups_index = _CONV[producer.target]
                groups = producer.args[groups_index] if len(producer.args) > groups_index else 1
                if not isinstance(groups, int):
                    continue
                new_w, new_b = _fold_into_conv(weight, bias, (mean, var, call.eps, bn_w, bn_b), transpose, groups)
        w_name = new_attr_name(model, "_folded_weight_")
        model.register_parameter(w_name, torch.nn.Parameter(new_w.detach(), requires_grad=False))
        b_name = new_attr_name(model, "_folded_bias_")
        model.register_parameter(b_name, torch.nn.Parameter(new_b.detach(), requires_grad=False))
        with model.graph.inserting_before(producer):
            w_node = model.graph.get_attr(w_name)
            b_node = model.graph.get_attr(b_name)
        _port_fold_meta(producer, (w_node, b_node))
        old_params = [a for a in producer.args[1:3] if isinstance(a, Node)]
        _describe_param(model, w_node, new_w, old_params[:1])
        _describe_param(model, b_node, new_b, old_params[1:])
        args = list(producer.args)
        args[1] = w_node
        if len(args) > 2:
            args[2] = b_node
        else:
            args.append(b_node)
        producer.args = tuple(args)
        out.replace_all_uses_with(producer)
        erase_dead(model.graph, [out, bn, *old_params])  # with the BN's parameters and buffers
        folded += 1
    if folded:
        # also the get_attrs export left unused, such as each BN's num_batches_tracked
        erase_dead(model.graph, [n for n in model.graph.nodes if n.op == "get_attr"])
        model.recompile()
    return folded

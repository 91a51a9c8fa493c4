"""For ``lower``: each quantized conv1d compiled as the conv2d over a height of 1 (the same values).

torch 2.13's inductor lowers a quantized conv1d to ``onednn.qconv_pointwise`` with the weight
prepacked as ``[out, in, 1, k]``, but the op's fake (meta) kernel takes that weight's dims 2..
as the kernel of the input's spatial dims: for a conv1d it reads a kernel of 1 instead of ``k``
and records an output length as if the kernel were 1 (``dilation * (k - 1)`` too long before the
stride). Inductor's lowering itself
computes the right length, so a graph where nothing checks the length compiles; one where a
later op does (``y.permute(0, 2, 1) + positions`` in Whisper's encoder, a reshape, a cat) fails
in inductor's fake-tensor pass with "Attempting to broadcast a dimension ...".

Written as ``squeeze(conv2d(unsqueeze(x, 2), w[:, :, None]), 2)`` -- stride, padding and
dilation ``(1, s)``, ``(0, p)``, ``(1, d)`` -- the conv is still matched by inductor's int8 conv
passes (its weight is 4-d, the meta kernel reads it right) and stays an int8 oneDNN conv. The
unsqueeze goes on the int8 tensor before the activation's dequantize, and the squeeze after the
activation inductor fuses into the conv (relu, hardtanh, hardswish, silu) and the quantize of
the output, so the patterns inductor fuses are unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.fx import GraphModule, Node

from quantweave.authoring import attr_value, calls, copy_for_rewrite, dequantize_ops, finish_rewrite, only_user

aten = torch.ops.aten

_CONV1D = aten.conv1d.default
#: activations inductor fuses into an int8 conv (functional forms: they see the 4-d output)
_FUSED_UNARY = (aten.relu.default, aten.hardtanh.default, aten.hardswish.default, aten.silu.default)


@functools.cache
def _qd() -> Any:
    """``torch.ops.quantized_decomposed``, its ops registered (``dequantize_ops`` does that)."""
    dequantize_ops()
    return torch.ops.quantized_decomposed


def quantized_conv1ds_as_conv2ds(model: GraphModule) -> GraphModule:
    """``model`` with each conv1d of a quantized activation and an int8 constant weight compiled
    as the equivalent conv2d, on a copy sharing ``model``'s other tensors; ``model`` itself when
    it has none. ``model`` is not changed."""
    names = [n.name for n in model.graph.nodes if _int8_weight(n) is not None]
    if not names:
        return model
    rewritten, nodes = copy_for_rewrite(model)
    for name in names:
        _rewrite(rewritten, nodes[name])
    return finish_rewrite(rewritten)


def _int8_weight(node: Node) -> torch.Tensor | None:
    """The quantized ``[out, in, k]`` constant weight of a conv1d whose activation is dequantized
    per tensor (what inductor's int8 conv passes match), or None."""
    if not calls(node, _CONV1D) or len(node.args) < 2 or node.kwargs:
        return None
    qd = _qd()
    x, weight = node.args[0], node.args[1]
    if not isinstance(x, Node) or not calls(x, (qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor)):
        return None
    if not isinstance(x.args[0], Node):
        return None
    if not isinstance(weight, Node) or weight.kwargs:
        return None
    if not calls(weight, (qd.dequantize_per_channel.default, qd.dequantize_per_tensor.default)):
        return None
    value = attr_value(weight.args[0])
    if not isinstance(value, torch.Tensor) or value.dim() != 3:
        return None
    if weight.target == qd.dequantize_per_channel.default and weight.args[3] not in (0, 1):
        return None  # a channel axis of 0 or 1 is the same axis of the 4-d weight
    return value


def _conv1d_args(node: Node) -> tuple[Any, list[Any], list[Any], list[Any], Any]:
    """(bias, stride, padding, dilation, groups) of an ``aten.conv1d.default`` call."""
    given: list[Any] = list(node.args[2:])
    defaults: list[Any] = [None, [1], [0], [1], 1]
    bias, stride, padding, dilation, groups = given + defaults[len(given) :]
    return bias, list(stride), list(padding), list(dilation), groups


def _rewrite(model: GraphModule, conv: Node) -> None:
    graph = model.graph
    weight = _int8_weight(conv)
    assert weight is not None
    x_dequantize, w_dequantize = conv.args[0], conv.args[1]
    assert isinstance(x_dequantize, Node) and isinstance(w_dequantize, Node)
    bias, stride, padding, dilation, groups = _conv1d_args(conv)

    source = w_dequantize.args[0]
    assert isinstance(source, Node)
    name = f"{str(source.target).replace('.', '_')}_2d"
    while hasattr(model, name):
        name += "_"
    model.register_buffer(name, weight.unsqueeze(2))  # a view: the int8 values are shared

    with graph.inserting_before(conv):
        x4 = graph.call_function(aten.unsqueeze.default, (x_dequantize.args[0], 2))
        x4_dequantize = graph.call_function(
            x_dequantize.target,  # type: ignore[arg-type]
            (x4, *x_dequantize.args[1:]),
            dict(x_dequantize.kwargs),
        )
        w4 = graph.get_attr(name)
        w4_dequantize = graph.call_function(
            w_dequantize.target,  # type: ignore[arg-type]
            (w4, *w_dequantize.args[1:]),
        )
        conv2d = graph.call_function(
            aten.conv2d.default,
            (x4_dequantize, w4_dequantize, bias, [1, *stride], [0, *padding], [1, *dilation], groups),
        )
    conv2d.meta.update({k: v for k, v in conv.meta.items() if k in ("stack_trace", "nn_module_stack")})
    conv.replace_all_uses_with(conv2d)
    graph.erase_node(conv)

    # the squeeze after what inductor fuses into the conv: an activation, the output's quantize
    end = conv2d
    user = only_user(end)
    if calls(user, _FUSED_UNARY) and user is not None and user.args[0] is end:
        end = user
    user = only_user(end)
    if calls(user, _qd().quantize_per_tensor.default) and user is not None and user.args[0] is end:
        end = user
    with graph.inserting_after(end):
        squeezed = graph.call_function(aten.squeeze.dim, (end, 2))
    end.replace_all_uses_with(squeezed, delete_user_cb=lambda n: n is not squeezed)

"""QAT for conv + batch norm: simulate the fold while training, fold for real at convert.

PTQ folds eval-mode batch norm into the conv before annotation. QAT cannot: batch norm keeps
training. Instead, ``prepare_qat_pt2e`` rewrites every annotated ``conv -> batch_norm``
into the one-pass approximation of Jacob et al. (2018), section 3.2::

    scale  = bn.weight / sqrt(bn.running_var + bn.eps)
    y      = conv(x, fake_quant(weight * scale[:, None, ...]))     # quantized as it will be
    y      = y / scale[None, :, None, ...] + conv.bias[None, :, None, ...]
    out    = batch_norm(y, ...)                                      # still training

so the weight fake-quantizer sees the weight the converted model will carry, while batch
norm still normalises with batch statistics. ``convert_pt2e`` then folds the current
running statistics into the conv (weight and bias) and drops the batch norm; the weight's
fake-quantizer gives the int8 weight its qparams.

The conv and batch norm nodes keep their identity (annotations on them stay valid); the
conv's weight edge becomes ``(scaled weight, conv)`` and every spec naming the old edge is
updated. The batch norm's ``eps`` is read from the graph (not assumed to be 1e-5).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node
from torch.nn.utils.fusion import fuse_conv_bn_weights

from ..annotation import ANNOTATION_KEY, QuantizationAnnotation
from ..errors import ConvertError
from .batch_norm import batch_norm_call
from .graph import erase_dead, get_attr_value, new_attr_name, port_meta, remap_annotations

aten = torch.ops.aten

#: conv node meta key recording the rewritten pattern (node names and parameter targets)
QAT_CONV_BN_KEY = "quantweave_qat_conv_bn"

_CONVS = (aten.conv1d.default, aten.conv2d.default, aten.conv3d.default)
#: transposed convs carry output channels on weight axis 1; rewritten when groups == 1
_CONV_TRANSPOSES = (aten.conv_transpose1d.default, aten.conv_transpose2d.input, aten.conv_transpose3d.input)
_TRANSPOSE_GROUPS_ARG = 6  # conv_transposeNd(input, weight, bias, stride, padding, output_padding, groups, dilation)
_BN = (aten.batch_norm.default,)


def _param_target(node: object) -> str | None:
    """The attribute path of a get_attr argument (None for a None argument); KeyError otherwise."""
    if node is None:
        return None
    if isinstance(node, Node) and node.op == "get_attr":
        return str(node.target)
    raise KeyError(node)


def _meta_value(gm: GraphModule, arg: Any) -> Any:
    """A meta-device stand-in for an argument, for shape/dtype propagation."""
    if not isinstance(arg, Node):
        return arg
    val = arg.meta.get("val")
    if val is None and arg.op == "get_attr":
        val = get_attr_value(gm, str(arg.target))
    if isinstance(val, torch.Tensor):
        return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")
    return val


def _call(gm: GraphModule, op: Callable[..., Any], args: tuple[Any, ...], like: Node) -> Node:
    node = gm.graph.call_function(op, args)
    node.meta["val"] = op(*(_meta_value(gm, a) for a in args))
    port_meta(like, node)
    return node


def simulate_conv_bn(gm: GraphModule) -> int:
    """Rewrite annotated ``conv -> batch_norm`` pairs for QAT (see the module docstring).

    A pair is rewritten when the conv's weight edge has a spec, the conv has no output
    spec of its own, its only user is the batch norm, and weight and batch-norm statistics
    are parameters/buffers. A transposed conv (weight ``(in, out, *kernel)``) is rewritten
    with its scale on weight axis 1, when it has one group. Returns how many pairs were
    rewritten.
    """
    graph = gm.graph
    edge_map: dict[tuple[Node, Node], Node] = {}
    rewritten = 0
    for conv in list(graph.nodes):
        if conv.op != "call_function" or conv.target not in _CONVS + _CONV_TRANSPOSES or len(conv.users) != 1:
            continue
        transpose = conv.target in _CONV_TRANSPOSES
        if transpose and _transpose_groups(conv) != 1:
            continue
        annotation = conv.meta.get(ANNOTATION_KEY)
        weight = conv.args[1]
        if not isinstance(annotation, QuantizationAnnotation) or annotation.output_qspec is not None:
            continue
        if not isinstance(weight, Node) or annotation.input_qspec_map.get(weight) is None:
            continue
        (bn,) = conv.users
        call = batch_norm_call(bn, _BN)
        if call is None or call.input is not conv:
            continue
        bias = conv.args[2] if len(conv.args) > 2 else None
        try:
            record: dict[str, str | bool | None] = {
                "weight": _param_target(weight),
                "bias": _param_target(bias),
                "bn_weight": _param_target(call.weight),
                "bn_bias": _param_target(call.bias),
                "running_mean": _param_target(call.running_mean),
                "running_var": _param_target(call.running_var),
            }
        except KeyError:
            continue
        if record["weight"] is None or record["running_mean"] is None or record["running_var"] is None:
            continue
        eps = call.eps
        rank = get_attr_value(gm, str(record["weight"])).dim()
        bn_weight, running_var = call.weight, call.running_var
        assert isinstance(running_var, Node) and isinstance(bias, (Node, type(None)))
        with graph.inserting_before(conv):
            std = _call(gm, aten.sqrt.default, (_call(gm, aten.add.Tensor, (running_var, eps), conv),), conv)
            if isinstance(bn_weight, Node):
                scale = _call(gm, aten.div.Tensor, (bn_weight, std), conv)
            else:
                scale = _call(gm, aten.reciprocal.default, (std,), conv)
            # the scale runs along the weight's output-channel axis: 0 for conv, 1 for conv_transpose
            per_channel = [1, -1] + [1] * (rank - 2) if transpose else [-1] + [1] * (rank - 1)
            weight_scale = _call(gm, aten.reshape.default, (scale, per_channel), conv)
            scaled_weight = _call(gm, aten.mul.Tensor, (weight, weight_scale), conv)
            zero_bias = None
            if bias is not None and annotation.input_qspec_map.get(bias) is not None:
                zero_bias = _call(gm, aten.zeros_like.default, (bias,), conv)
        with graph.inserting_before(bn):
            out_scale = _call(gm, aten.reshape.default, (scale, [1, -1] + [1] * (rank - 2)), conv)
            restored = _call(gm, aten.div.Tensor, (conv, out_scale), conv)
            if bias is not None:
                bias_shape = _call(gm, aten.reshape.default, (bias, [1, -1] + [1] * (rank - 2)), conv)
                restored = _call(gm, aten.add.Tensor, (restored, bias_shape), conv)
        bn.replace_input_with(conv, restored)
        args = list(conv.args)
        args[1] = scaled_weight
        if len(args) > 2:
            args[2] = zero_bias
        conv.args = tuple(args)
        edge_map[(weight, conv)] = scaled_weight
        if bias is not None and zero_bias is not None:
            edge_map[(bias, conv)] = zero_bias
        record.update(bn=bn.name, scaled_weight=scaled_weight.name, zero_bias=getattr(zero_bias, "name", None))
        record["transpose"] = transpose
        conv.meta[QAT_CONV_BN_KEY] = record
        rewritten += 1
    if rewritten:
        # every annotation key and spec naming a rewritten edge names its new source; a bias
        # edge the rewrite removed (no spec) is dropped
        remap_annotations(gm.graph, edge_map=edge_map, drop_unquantized_non_inputs=True)
    return rewritten


def fold_simulated_conv_bn(gm: GraphModule) -> int:
    """Fold each conv/batch-norm pair rewritten by :func:`simulate_conv_bn` (convert time).

    The conv gets the batch norm's current running statistics folded into its weight and
    bias (new attributes; the trained ones are not modified); the batch norm, its
    ``num_batches_tracked`` update and the scaling nodes go. Raises :class:`ConvertError`
    naming the conv if the pattern was edited after ``prepare_qat_pt2e``.
    """
    graph = gm.graph
    by_name = {n.name: n for n in graph.nodes}
    get_attrs = {str(n.target): n for n in graph.nodes if n.op == "get_attr"}
    folded = 0
    for conv in list(graph.nodes):
        record = conv.meta.get(QAT_CONV_BN_KEY)
        if record is None:
            continue
        bn = _find_batch_norm(graph, by_name, record)
        scaled_weight = by_name.get(record["scaled_weight"])
        zero_bias = by_name.get(record["zero_bias"]) if record["zero_bias"] else None
        call = None if bn is None else batch_norm_call(bn, _BN)
        if bn is None or call is None or scaled_weight is None or (record["zero_bias"] and zero_bias is None):
            raise ConvertError(
                f"convert_pt2e: the QAT conv-batch-norm pattern of {conv.name!r} was changed after "
                f"prepare_qat_pt2e (expected batch norm {record['bn']!r} and scaled weight "
                f"{record['scaled_weight']!r} in the graph)"
            )

        values: dict[str, torch.Tensor | None] = {
            key: None if record[key] is None else get_attr_value(gm, str(record[key]))
            for key in ("weight", "bias", "bn_weight", "bn_bias", "running_mean", "running_var")
        }
        weight, bias = values["weight"], values["bias"]
        running_mean, running_var = values["running_mean"], values["running_var"]
        assert weight is not None and running_mean is not None and running_var is not None
        bn_weight, bn_bias = values["bn_weight"], values["bn_bias"]
        with torch.no_grad():
            new_weight, new_bias = fuse_conv_bn_weights(
                weight.detach(),
                None if bias is None else bias.detach(),
                running_mean.detach(),
                running_var.detach(),
                call.eps,
                torch.ones_like(running_mean) if bn_weight is None else bn_weight.detach(),
                torch.zeros_like(running_mean) if bn_bias is None else bn_bias.detach(),
                transpose=bool(record.get("transpose", False)),
            )
        w_name = new_attr_name(gm, "_qat_folded_weight_")
        gm.register_parameter(w_name, torch.nn.Parameter(new_weight.detach().clone(), requires_grad=False))
        b_name = new_attr_name(gm, "_qat_folded_bias_")
        gm.register_parameter(b_name, torch.nn.Parameter(new_bias.detach().clone(), requires_grad=False))
        with graph.inserting_before(scaled_weight):
            weight_node = graph.get_attr(w_name)
        scaled_weight.replace_all_uses_with(weight_node)
        if zero_bias is not None:
            with graph.inserting_before(zero_bias):
                bias_node = graph.get_attr(b_name)
            zero_bias.replace_all_uses_with(bias_node)
        else:
            with graph.inserting_before(conv):
                bias_node = graph.get_attr(b_name)
            args = list(conv.args)
            args[2:3] = [bias_node]
            conv.args = tuple(args)
        for new in (weight_node, bias_node):
            port_meta(conv, new)
        bn.replace_all_uses_with(conv)
        dead = [*bn.all_input_nodes, scaled_weight, *([zero_bias] if zero_bias is not None else [])]
        graph.erase_node(bn)  # not pure: it updated its running statistics
        _drop_batch_counter(gm, get_attrs, str(record["running_mean"]))
        erase_dead(graph, dead)
        del conv.meta[QAT_CONV_BN_KEY]
        folded += 1
    return folded


def _find_batch_norm(graph: Graph, by_name: dict[str, Node], record: dict[str, Any]) -> Node | None:
    """The batch norm of a rewritten pattern: the node named in ``record``, or -- when a pass
    replaced it (torchao's ``move_exported_model_to_eval`` rewrites batch norm into a new
    node) -- the one batch-norm node reading the same ``running_mean`` attribute."""
    bn = by_name.get(record["bn"])
    if bn is not None and batch_norm_call(bn, _BN) is not None:
        return bn
    found = []
    for node in graph.nodes:
        call = batch_norm_call(node, _BN)
        mean = None if call is None else call.running_mean
        if isinstance(mean, Node) and mean.op == "get_attr" and str(mean.target) == record["running_mean"]:
            found.append(node)
    return found[0] if len(found) == 1 else None


def _transpose_groups(conv: Node) -> int:
    groups = (
        conv.args[_TRANSPOSE_GROUPS_ARG] if len(conv.args) > _TRANSPOSE_GROUPS_ARG else conv.kwargs.get("groups", 1)
    )
    return groups if isinstance(groups, int) else -1


def _drop_batch_counter(gm: GraphModule, get_attrs: dict[str, Node], running_mean: str) -> None:
    """Erase ``num_batches_tracked.add_(1)`` of the batch norm owning ``running_mean``.

    ``get_attrs`` maps attribute targets to their get_attr node (one lookup, not a scan of
    the graph per batch norm).
    """
    prefix = running_mean.rpartition(".")[0]
    node = get_attrs.pop(f"{prefix}.num_batches_tracked" if prefix else "num_batches_tracked", None)
    if node is None:
        return
    for user in list(node.users):
        if user.op == "call_function" and user.target is aten.add_.Tensor and not user.users:
            gm.graph.erase_node(user)
    if not node.users:
        gm.graph.erase_node(node)

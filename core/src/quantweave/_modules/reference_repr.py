"""``convert_pt2e(..., use_reference_representation=True)``: quantized ops in integer arithmetic.

The q/dq form says *what* is quantized (``dequantize -> float op -> quantize``); the reference
representation says *how an integer kernel computes it*, in plain aten ops a reader (or a
backend author) can check:

- static linear / conv (per-tensor activations, per-tensor or per-channel int weights, a
  float or absent bias): int32 accumulation of ``(x_q - x_zp) * (w_q - w_zp)``, plus the bias
  quantized to int32 with scale ``x_scale * w_scale``, requantized to the output's int dtype
  with the float multiplier ``x_scale * w_scale / out_scale``, rounded, offset by the output
  zero point and clamped;
- add (optionally followed by relu): each input rescaled to the output scale in integer
  steps (``round((q - zp) * in_scale / out_scale)``), summed, offset, clamped (at the output
  zero point for relu);
- max_pool2d between two quantizations with the same qparams: the pool of the integers;
- every quantize / dequantize left (graph inputs and outputs, other ops): written as the
  aten arithmetic it is (``clamp(round(x / scale) + zp)``, ``(q - zp) * scale``).

The result agrees with the q/dq form to within one quantization step of the output (the
float multiplier rounds once where the q/dq form rounds the float result; tested).
Constant weights and biases are prepared once, at conversion (int32 constants).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from .graph import erase_dead, get_attr_value, new_attr_name, port_meta
from .torch_compat import quantized_decomposed_ops

__all__ = ["to_reference_representation"]

aten = torch.ops.aten


class _QParams:
    """A static quantization read from a quantize/dequantize node's arguments."""

    def __init__(self, gm: GraphModule, node: Node) -> None:
        qd = quantized_decomposed_ops()
        self.node = node
        if node.target in (qd.quantize_per_channel.default, qd.dequantize_per_channel.default):
            _, scale, zero_point, axis, qmin, qmax, dtype = node.args[:7]
            self.scale = _value(gm, scale).to(torch.float64)
            self.zero_point = _value(gm, zero_point).to(torch.int64)
            self.axis: int | None = int(axis)  # type: ignore[arg-type]
        else:
            _, scale, zero_point, qmin, qmax, dtype = node.args[:6]
            self.scale = torch.tensor(float(scale), dtype=torch.float64)  # type: ignore[arg-type]
            self.zero_point = torch.tensor(int(zero_point), dtype=torch.int64)  # type: ignore[arg-type]
            self.axis = None
        self.qmin, self.qmax, self.dtype = int(qmin), int(qmax), dtype  # type: ignore[arg-type]


def _value(gm: GraphModule, arg: Any) -> torch.Tensor:
    if isinstance(arg, Node):
        assert arg.op == "get_attr"
        return torch.as_tensor(get_attr_value(gm, str(arg.target)))
    return torch.as_tensor(arg)


def _static_dq(node: Any) -> bool:
    qd = quantized_decomposed_ops()
    return (
        isinstance(node, Node)
        and node.op == "call_function"
        and node.target in (qd.dequantize_per_tensor.default, qd.dequantize_per_channel.default)
        and not node.kwargs.get("out_dtype")
        and all(not isinstance(a, Node) or a.op == "get_attr" for a in node.args[1:3])
    )


def _literal_qparams(node: Node) -> bool:
    return not any(isinstance(a, Node) for a in node.args[1:3])


def _is_static_q(node: Node) -> bool:
    qd = quantized_decomposed_ops()
    return node.op == "call_function" and node.target is qd.quantize_per_tensor.default and _literal_qparams(node)


def _constant(gm: GraphModule, graph: Graph, before: Node, value: torch.Tensor, prefix: str) -> Node:
    name = new_attr_name(gm, prefix)
    gm.register_buffer(name, value)
    with graph.inserting_before(before):
        node = graph.get_attr(name)
    node.meta["val"] = value
    return node


def _call(graph: Graph, op: Any, args: tuple[Any, ...], like: Node, kwargs: dict[str, Any] | None = None) -> Node:
    node = graph.call_function(op, args, kwargs or {})
    port_meta(like, node)
    return node


def _centered(graph: Graph, q: Node, zero_point: int, like: Node) -> Node:
    """``int32(q) - zero_point``."""
    wide = _call(graph, aten._to_copy.default, (q,), like, {"dtype": torch.int32})
    return _call(graph, aten.sub.Tensor, (wide, zero_point), like) if zero_point else wide


def _requantize(graph: Graph, acc: Node, multiplier: Any, out: _QParams, like: Node, low: int | None = None) -> Node:
    """``clamp(round(acc * multiplier) + out_zp, qmin, qmax)`` as the output's int dtype."""
    if isinstance(multiplier, float) and multiplier == 1.0:  # already integer-valued
        wide = _call(graph, aten._to_copy.default, (acc,), like, {"dtype": torch.int32})
    else:
        as_float = _call(graph, aten._to_copy.default, (acc,), like, {"dtype": torch.float32})
        scaled = _call(graph, aten.mul.Tensor, (as_float, multiplier), like)
        rounded = _call(graph, aten.round.default, (scaled,), like)
        wide = _call(graph, aten._to_copy.default, (rounded,), like, {"dtype": torch.int32})
    shifted = _call(graph, aten.add.Tensor, (wide, int(out.zero_point)), like) if int(out.zero_point) else wide
    bottom = out.qmin if low is None else max(out.qmin, low)
    clamped = _call(graph, aten.clamp.default, (shifted, bottom, out.qmax), like)
    return _call(graph, aten._to_copy.default, (clamped,), like, {"dtype": out.dtype})


def _weighted(gm: GraphModule, q_out: Node) -> bool:
    """``dq(x) -> linear / conv2d(dq(w), bias) -> q``: integer matmul / convolution."""
    op = q_out.args[0]
    if not isinstance(op, Node) or op.target not in (aten.linear.default, aten.conv2d.default) or len(op.users) != 1:
        return False
    dq_x, dq_w = op.args[0], op.args[1]
    bias = op.args[2] if len(op.args) > 2 else None
    if not (_static_dq(dq_x) and _static_dq(dq_w)) or dq_x.target is not _per_tensor_dq():  # type: ignore[union-attr]
        return False
    assert isinstance(dq_x, Node) and isinstance(dq_w, Node)
    w_q = dq_w.args[0]
    if not isinstance(w_q, Node) or w_q.op != "get_attr":
        return False
    if bias is not None and not (isinstance(bias, Node) and bias.op == "get_attr"):
        return False
    x, w, out = _QParams(gm, dq_x), _QParams(gm, dq_w), _QParams(gm, q_out)
    if w.axis not in (None, 0):
        return False
    graph = gm.graph
    weight = get_attr_value(gm, str(w_q.target)).to(torch.int64)
    rank = weight.dim()
    per_row = [-1] + [1] * (rank - 1)
    w_zp = w.zero_point.reshape(per_row) if w.axis == 0 else w.zero_point
    w_int = (weight - w_zp).to(torch.int32)
    acc_scale = x.scale * w.scale  # per output channel (or one)
    with graph.inserting_before(op):
        xi = _centered(graph, dq_x.args[0], int(x.zero_point), op)  # type: ignore[arg-type]
        wi = _constant(gm, graph, xi, w_int, "_reference_weight_")
        if op.target is aten.linear.default:
            acc = _call(graph, aten.matmul.default, (xi, _call(graph, aten.t.default, (wi,), op)), op)
        else:
            acc = _call(graph, aten.conv2d.default, (xi, wi, None, *op.args[3:]), op)
        if bias is not None:
            b_float = get_attr_value(gm, str(bias.target)).to(torch.float64)
            b_int = torch.round(b_float / acc_scale.expand_as(b_float)).to(torch.int32)
            if op.target is aten.conv2d.default:
                b_int = b_int.reshape([-1] + [1] * (rank - 2))
            acc = _call(graph, aten.add.Tensor, (acc, _constant(gm, graph, xi, b_int, "_reference_bias_")), op)
        multiplier = (acc_scale / out.scale).to(torch.float32)
        if multiplier.numel() > 1:
            shape = [-1] if op.target is aten.linear.default else [-1] + [1] * (rank - 2)
            mult: Any = _constant(gm, graph, xi, multiplier.reshape(shape), "_reference_multiplier_")
        else:
            mult = float(multiplier)
        result = _requantize(graph, acc, mult, out, op)
    q_out.replace_all_uses_with(result)
    erase_dead(graph, [q_out])
    return True


def _per_tensor_dq() -> Any:
    return quantized_decomposed_ops().dequantize_per_tensor.default


def _add(gm: GraphModule, q_out: Node) -> bool:
    """``dq(a) + dq(b) [-> relu] -> q``: each input rescaled to the output scale, summed."""
    op = q_out.args[0]
    relu = None
    if isinstance(op, Node) and op.target in (aten.relu.default, aten.relu_.default) and len(op.users) == 1:
        relu, op = op, op.args[0]
    if not isinstance(op, Node) or op.target is not aten.add.Tensor or len(op.users) != 1 or len(op.args) != 2:
        return False
    if op.kwargs.get("alpha", 1) != 1 or not all(
        _static_dq(a) and getattr(a, "target", None) is _per_tensor_dq() for a in op.args
    ):
        return False
    out = _QParams(gm, q_out)
    graph = gm.graph
    with graph.inserting_before(op):
        terms = []
        for dq in op.args:
            assert isinstance(dq, Node)
            qp = _QParams(gm, dq)
            centered = _centered(graph, dq.args[0], int(qp.zero_point), op)  # type: ignore[arg-type]
            as_float = _call(graph, aten._to_copy.default, (centered,), op, {"dtype": torch.float32})
            scaled = _call(graph, aten.mul.Tensor, (as_float, float(qp.scale / out.scale)), op)
            terms.append(_call(graph, aten.round.default, (scaled,), op))
        total = _call(graph, aten.add.Tensor, tuple(terms), op)
        result = _requantize(graph, total, 1.0, out, op, low=int(out.zero_point) if relu is not None else None)
    q_out.replace_all_uses_with(result)
    erase_dead(graph, [q_out])
    return True


def _max_pool(gm: GraphModule, q_out: Node) -> bool:
    """``dq(x) -> max_pool2d -> q`` with the same qparams: the pool of the integers."""
    op = q_out.args[0]
    if not isinstance(op, Node) or op.target is not aten.max_pool2d.default or len(op.users) != 1:
        return False
    dq = op.args[0]
    if not (_static_dq(dq) and dq.target is _per_tensor_dq()):  # type: ignore[union-attr]
        return False
    assert isinstance(dq, Node)
    if tuple(dq.args[1:6]) != tuple(q_out.args[1:6]):
        return False
    graph = gm.graph
    with graph.inserting_before(op):
        result = _call(graph, aten.max_pool2d.default, (dq.args[0], *op.args[1:]), op)
    q_out.replace_all_uses_with(result)
    erase_dead(graph, [q_out])
    return True


def _decompose_qdq(gm: GraphModule) -> None:
    """Every quantize / dequantize left, written as its aten arithmetic."""
    qd = quantized_decomposed_ops()
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or not node.users:
            continue
        quantize = node.target in (qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor)
        dequantize = node.target in (qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor)
        per_channel_q = node.target is qd.quantize_per_channel.default
        per_channel_dq = node.target is qd.dequantize_per_channel.default
        if not (quantize or dequantize or per_channel_q or per_channel_dq):
            continue
        source = node.args[0]
        with graph.inserting_before(node):
            if per_channel_q or per_channel_dq:
                _, scale, zero_point, axis, qmin, qmax, dtype = node.args[:7]
                val = source.meta.get("val") if isinstance(source, Node) else None
                rank = val.dim() if isinstance(val, torch.Tensor) else None
                if rank is None and isinstance(source, Node) and source.op == "get_attr":
                    rank = get_attr_value(gm, str(source.target)).dim()
                if rank is None:
                    continue
                shape = [1] * rank
                shape[int(axis)] = -1
                scale = _call(graph, aten.reshape.default, (scale, shape), node)
                zero_point = _call(graph, aten.reshape.default, (zero_point, shape), node)
            else:
                _, scale, zero_point, qmin, qmax, dtype = node.args[:6]
            if quantize or per_channel_q:
                scaled = _call(graph, aten.div.Tensor, (source, scale), node)
                rounded = _call(graph, aten.round.default, (scaled,), node)
                shifted = _call(graph, aten.add.Tensor, (rounded, zero_point), node)
                clamped = _call(graph, aten.clamp.default, (shifted, qmin, qmax), node)
                result = _call(graph, aten._to_copy.default, (clamped,), node, {"dtype": dtype})
            else:
                out_dtype = node.kwargs.get("out_dtype") or torch.float32
                wide = _call(graph, aten._to_copy.default, (source,), node, {"dtype": torch.float32})
                centered = _call(graph, aten.sub.Tensor, (wide, zero_point), node)
                result = _call(graph, aten.mul.Tensor, (centered, scale), node)
                if out_dtype != torch.float32 or isinstance(scale, Node):  # run-time scales are float64
                    result = _call(graph, aten._to_copy.default, (result,), node, {"dtype": out_dtype})
        node.replace_all_uses_with(result)
        graph.erase_node(node)


def to_reference_representation(gm: GraphModule) -> int:
    """Rewrite ``gm`` (a converted model, the working copy) in place; returns how many
    quantized ops were written in integer arithmetic (the q/dq nodes left are decomposed too)."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.graph is not gm.graph or not _is_static_q(node):
            continue
        for rewrite in (_weighted, _add, _max_pool):
            if rewrite(gm, node):
                rewritten += 1
                break
    _decompose_qdq(gm)
    erase_dead(gm.graph, [n for n in gm.graph.nodes if n.op in ("call_function", "get_attr") and not n.users])
    return rewritten

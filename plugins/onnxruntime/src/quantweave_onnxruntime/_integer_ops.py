"""Dynamic quantization on ONNX: PT2E's run-time qparams as ONNX Runtime's integer ops.

A dynamically quantized linear / matmul is, after ``convert_pt2e``,
``choose_qparams -> quantize -> dequantize -> linear``. torch.onnx has no translation of
``choose_qparams``; :data:`translations` gives one (``DynamicQuantizeLinear``, which computes
the same uint8 qparams: the range widened to hold 0, scale (max - min) / 255, zero point
rounded half to even), and :func:`to_integer_ops` rewrites the exported graph into what
ORT's own ``quantize_dynamic`` writes, so that ORT fuses it into ``DynamicQuantizeMatMul`` /
``MatMulIntegerToFloat``:

    DynamicQuantizeLinear(x) -> MatMulInteger(x_q, W_q^T, x_zp, w_zp) -> Cast(float)
        -> Mul(x_scale * w_scale) [-> Add(bias)]

Left as QDQ (``DQ -> MatMul``), ORT runs the weight as ``MatMulNBits`` with float activations.
Imported only by :func:`quantweave_onnxruntime.to_onnx` (needs onnx / onnxscript).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

__all__ = ["has_dynamic_quantization", "to_integer_ops", "translations"]

_qd = torch.ops.quantized_decomposed


def has_dynamic_quantization(model: torch.nn.Module) -> bool:
    """Whether a converted GraphModule chooses qparams at run time (uint8 per tensor)."""
    graph = getattr(model, "graph", None)
    return graph is not None and any(n.target == _qd.choose_qparams.tensor for n in graph.nodes)


def translations() -> dict[Any, Any]:
    """torch.onnx ``custom_translation_table`` entries for the dynamic ops of a converted model."""
    from onnxscript import opset18 as op

    def choose_qparams(x: Any, quant_min: int, quant_max: int, eps: float, dtype: int) -> Any:
        if (quant_min, quant_max) != (0, 255):
            raise ValueError(
                f"to_onnx: choose_qparams over [{quant_min}, {quant_max}]: ONNX DynamicQuantizeLinear "
                "computes uint8 [0, 255] qparams only"
            )
        _, scale, zero_point = op.DynamicQuantizeLinear(x)
        return scale, zero_point

    def quantize(x: Any, scale: Any, zero_point: Any, quant_min: int, quant_max: int, dtype: int) -> Any:
        return op.QuantizeLinear(x, scale, zero_point)

    def dequantize(
        x: Any, scale: Any, zero_point: Any, quant_min: int, quant_max: int, dtype: int, out_dtype: Any = None
    ) -> Any:
        return op.DequantizeLinear(x, scale, zero_point)

    return {
        _qd.choose_qparams.tensor: choose_qparams,
        _qd.quantize_per_tensor.tensor: quantize,
        _qd.dequantize_per_tensor.tensor: dequantize,
    }


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.graph = model.graph
        self.inits = {t.name: t for t in self.graph.initializer}
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.consumers: dict[str, list[Any]] = collections.defaultdict(list)
        for n in self.graph.node:
            for name in n.input:
                self.consumers[name].append(n)
        self.outputs = {o.name for o in self.graph.output}
        self.counter = 0

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"qw_{stem}_{self.counter}"

    def array(self, name: str) -> np.ndarray | None:
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute:
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def add_init(self, stem: str, value: np.ndarray) -> str:
        name = self.fresh(stem)
        tensor = numpy_helper.from_array(value, name)
        self.graph.initializer.append(tensor)
        self.inits[name] = tensor
        return name


def _attr(node: Any, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _dequantize(g: _Graph, name: str) -> Any:
    node = g.producer.get(name)
    return node if node is not None and node.op_type == "DequantizeLinear" else None


def _dynamic_operand(g: _Graph, name: str) -> tuple[str, str, str] | None:
    """``DQ(DynamicQuantizeLinear(x)[0], scale, zp)`` -> (x_q, scale, zp)."""
    dq = _dequantize(g, name)
    if dq is None:
        return None
    source = g.producer.get(dq.input[0])
    if source is None or source.op_type != "DynamicQuantizeLinear" or len(dq.input) < 3:
        return None
    return dq.input[0], dq.input[1], dq.input[2]


def _weight_operand(g: _Graph, name: str, transposed: bool) -> tuple[str, str, str] | None:
    """An int8 weight W [N, K] as the [K, N] right operand of a product: ``Transpose(DQ(W))``
    (MatMul) or ``DQ(W)`` with ``transB=1`` (Gemm). Returns (W^T initializer, column scales,
    column zero points)."""
    if not transposed:
        node = g.producer.get(name)
        if node is None or node.op_type != "Transpose" or list(_attr(node, "perm", [1, 0])) != [1, 0]:
            return None
        name = node.input[0]
    dq = _dequantize(g, name)
    if dq is None or len(dq.input) < 3:
        return None
    weight, scale, zero_point = g.array(dq.input[0]), g.array(dq.input[1]), g.array(dq.input[2])
    if weight is None or scale is None or zero_point is None or weight.ndim != 2 or weight.dtype != np.int8:
        return None
    if scale.size > 1 and int(_attr(dq, "axis", 1)) not in (0, -2):
        return None
    w_t = g.add_init("weight_t", np.ascontiguousarray(weight.T))
    w_scale = g.add_init("weight_scale", scale.astype(np.float32))
    w_zero = g.add_init("weight_zero_point", zero_point.astype(np.int8))
    return w_t, w_scale, w_zero


def to_integer_ops(path: Path) -> int:
    """Rewrite the dynamic units of the ONNX model at ``path`` in place; returns how many
    products became ``MatMulInteger``."""
    model = onnx.load(str(path))
    g = _Graph(model)
    graph = g.graph
    # 1. quantize(x, DQL(x).scale, DQL(x).zp) is DQL(x)'s own first output
    dynamic = {n.input[0]: n for n in graph.node if n.op_type == "DynamicQuantizeLinear"}
    renamed: dict[str, str] = {}
    for node in list(graph.node):
        source = dynamic.get(node.input[0]) if node.op_type == "QuantizeLinear" and node.input else None
        if source is not None and list(node.input[1:3]) == list(source.output[1:3]):
            renamed[node.output[0]] = source.output[0]
            graph.node.remove(node)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    # choose_qparams' scale / zero point are float64 / int64 in torch: let ONNX infer them
    produced = {o for n in dynamic.values() for o in n.output}
    kept = [v for v in graph.value_info if v.name not in produced]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    g = _Graph(model)
    # 2. DQ-fed MatMul / Gemm -> MatMulInteger -> Cast -> Mul [-> Add]
    rewritten = 0
    new_nodes: list[Any] = []
    for node in graph.node:
        replacement = None
        if node.op_type == "MatMul":
            replacement = _product(g, node, node.input[0], node.input[1], None, transposed=False)
        elif (
            node.op_type == "Gemm"
            and int(_attr(node, "transA", 0)) == 0
            and int(_attr(node, "transB", 0)) == 1
            and float(_attr(node, "alpha", 1.0)) == 1.0
            and float(_attr(node, "beta", 1.0)) == 1.0
        ):
            bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
            replacement = _product(g, node, node.input[0], node.input[1], bias, transposed=True)
        if replacement is None:
            new_nodes.append(node)
        else:
            new_nodes.extend(replacement)
            rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(new_nodes)
        _remove_dead(model)
        onnx.save(model, str(path))
    elif renamed:
        onnx.save(model, str(path))
    return rewritten


def _product(g: _Graph, node: Any, a: str, b: str, bias: str | None, transposed: bool) -> list[Any] | None:
    left = _dynamic_operand(g, a)
    if left is None:
        return None
    right = _weight_operand(g, b, transposed)
    if right is None and not transposed:
        right = _dynamic_operand(g, b)
    if right is None:
        return None
    (a_q, a_scale, a_zero), (b_q, b_scale, b_zero) = left, right
    out = node.output[0]
    product, as_float, scale = g.fresh("matmul_integer"), g.fresh("as_float"), g.fresh("scale")
    scaled = g.fresh("scaled") if bias else out
    nodes = [
        helper.make_node("MatMulInteger", [a_q, b_q, a_zero, b_zero], [product], name=g.fresh("MatMulInteger")),
        helper.make_node("Cast", [product], [as_float], to=TensorProto.FLOAT, name=g.fresh("Cast")),
        helper.make_node("Mul", [a_scale, b_scale], [scale], name=g.fresh("Mul")),
        helper.make_node("Mul", [as_float, scale], [scaled], name=g.fresh("Mul")),
    ]
    if bias:
        nodes.append(helper.make_node("Add", [scaled, bias], [out], name=g.fresh("Add")))
    return nodes


def _remove_dead(model: onnx.ModelProto) -> None:
    graph = model.graph
    live = {o.name for o in graph.output}
    kept: list[Any] = []
    for node in reversed(list(graph.node)):
        if any(o in live for o in node.output):
            kept.append(node)
            live.update(i for i in node.input if i)
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    inits = [t for t in graph.initializer if t.name in live]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    values = [v for v in graph.value_info if v.name in live]
    del graph.value_info[:]
    graph.value_info.extend(values)

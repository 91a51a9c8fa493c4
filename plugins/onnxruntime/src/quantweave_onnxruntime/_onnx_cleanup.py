"""Post-processing of the exported ONNX model. Before it is written (:func:`before_save`, on the
exporter's ``onnx_ir`` model): a scalar Mul between a DequantizeLinear and a QuantizeLinear gets
an exact quantized constant, so ORT runs it as QLinearMul (:func:`quantize_constant_muls`), and
the exporter's debug metadata is dropped (:func:`drop_export_metadata`). After: Relus and Clips
that the next QuantizeLinear makes redundant, removed in one load and one save of the file
(:func:`drop_redundant_activations`).

A Relu whose only consumer is a QuantizeLinear with the lowest value of its dtype as zero point
changes nothing (the QuantizeLinear clamps there already); ONNX Runtime's own quantizer leaves
such a Relu out too (its QDQ node unit is then DQ -> op -> Q whatever graph rewrites ORT applies
first, e.g. a 3-D linear's reshapes).

A conv2d followed by relu6 / hardtanh is annotated as one unit (the clip folded into the
output's range, :mod:`._annotator`), so the exported graph reads
``DequantizeLinear -> Conv -> Clip(lo, hi) -> QuantizeLinear``. The QuantizeLinear saturates at
``scale * (qmin - zero_point)`` and ``scale * (qmax - zero_point)``; where those lie inside
``[lo, hi]`` (within a quarter of a step) the Clip cannot change any quantized value, and
ONNX Runtime's own quantizer writes no Clip there (its ClipQuantFusion removes such a Clip when
the session optimizes the graph). Dropping it in the file gives ORT the graph
``quantize_static`` writes at every optimization level and for every execution provider.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

__all__ = [
    "before_save",
    "drop_export_metadata",
    "drop_redundant_activations",
    "quantize_constant_muls",
    "redundant_clip",
]

#: prefix of the keys torch.onnx's exporter writes into a graph's metadata_props (the exported
#: program's graph signature and range constraints)
_TORCH_KEYS = "pkg.torch."

#: zero point dtype (onnx.TensorProto enum) -> (qmin, qmax) of QuantizeLinear's output
_RANGES = {
    2: (0, 255),  # UINT8
    3: (-128, 127),  # INT8
    4: (0, 65535),  # UINT16
    5: (-32768, 32767),  # INT16
}
_UINT8 = 2


def _constant(name: str, constants: dict[str, Any]) -> Any:
    """The value of a constant input as a numpy array; None when absent ("" is an omitted
    optional input) or computed."""
    from onnx import numpy_helper

    tensor = constants.get(name)
    return None if tensor is None else numpy_helper.to_array(tensor)


def redundant_clip(lo: float | None, hi: float | None, scale: float, zero_point: int, dtype: int) -> bool:
    """Whether ``QuantizeLinear(Clip(x, lo, hi))`` equals ``QuantizeLinear(x)`` for every x:
    True when the quantize saturates no further in than a quarter step inside ``[lo, hi]``
    (``lo / scale + zero_point <= qmin + 1/4`` and ``hi / scale + zero_point >= qmax - 1/4``:
    values the clip moves round to qmin / qmax either way). ``None``: no bound on that side."""
    if dtype not in _RANGES or not scale > 0:
        return False
    qmin, qmax = _RANGES[dtype]
    low_ok = lo is None or lo <= scale * (qmin - zero_point + 0.25)
    high_ok = hi is None or hi >= scale * (qmax - zero_point - 0.25)
    return bool(low_ok and high_ok)


def _clip_bounds(node: Any, constants: dict[str, Any]) -> tuple[bool, float | None, float | None]:
    """(known, lo, hi) of a Clip: opset >= 11 takes optional constant inputs, older opsets
    ``min`` / ``max`` attributes; ``known`` is False when a bound is computed at run time."""
    import onnx

    bounds: list[float | None] = [None, None]
    for i, attribute in enumerate(("min", "max")):
        if len(node.input) > i + 1 and node.input[i + 1]:
            value = _constant(node.input[i + 1], constants)
            if value is None or value.size != 1:
                return False, None, None
            bounds[i] = float(value.item())
        for attr in node.attribute:
            if attr.name == attribute:
                bounds[i] = float(onnx.helper.get_attribute_value(attr))
    return True, bounds[0], bounds[1]


def drop_redundant_activations(path: str | Path) -> int:
    """Remove from the ONNX model at ``path`` each Relu whose only consumer is a QuantizeLinear
    with the lowest value of its (u)int8 dtype as zero point, then each Clip whose only consumer
    is a per-tensor QuantizeLinear that makes it redundant (:func:`redundant_clip`), and the Clip
    bounds no node reads any more; the file is rewritten only when a node was removed. Returns
    how many were removed."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    constants: dict[str, Any] = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    outputs = {o.name for o in graph.output}
    relus = _drop(graph, lambda node, consumers: _redundant_relu(node, consumers, constants, outputs))
    clips = _drop(graph, lambda node, consumers: _redundant_clip_node(node, consumers, constants, outputs))
    bounds = {name for node in clips for name in node.input[1:] if name}
    still_read = {name for node in graph.node for name in node.input}
    for initializer in [t for t in graph.initializer if t.name in bounds and t.name not in still_read]:
        graph.initializer.remove(initializer)
    if relus or clips:
        onnx.save(model, str(path))
    return len(relus) + len(clips)


def _drop(graph: Any, redundant: Any) -> list[Any]:
    """Remove the nodes ``redundant(node, consumers)`` accepts, each QuantizeLinear that read one
    reading its input instead; returns them."""
    consumers: dict[str, list[Any]] = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    dropped = []
    for node in graph.node:
        if redundant(node, consumers):
            consumers[node.output[0]][0].input[0] = node.input[0]
            dropped.append(node)
    for node in dropped:
        graph.node.remove(node)
    return dropped


def _only_quantize(node: Any, consumers: dict[str, list[Any]], outputs: set[str]) -> Any:
    """The QuantizeLinear that alone reads ``node``'s output (not a graph output), or None."""
    if node.output[0] in outputs:
        return None
    users = consumers[node.output[0]]
    return users[0] if len(users) == 1 and users[0].op_type == "QuantizeLinear" else None


def _redundant_relu(node: Any, consumers: dict[str, list[Any]], constants: dict[str, Any], outputs: set[str]) -> bool:
    import onnx

    if node.op_type != "Relu":
        return False
    quantize = _only_quantize(node, consumers, outputs)
    if quantize is None or len(quantize.input) < 3:
        return False
    zero_point = constants.get(quantize.input[2])
    lowest = {onnx.TensorProto.UINT8: 0, onnx.TensorProto.INT8: -128}
    if zero_point is None or zero_point.data_type not in lowest:
        return False
    value = _constant(quantize.input[2], constants)
    return bool(value.size == 1 and int(value.item()) == lowest[zero_point.data_type])


def _redundant_clip_node(
    node: Any, consumers: dict[str, list[Any]], constants: dict[str, Any], outputs: set[str]
) -> bool:
    if node.op_type != "Clip" or node.domain not in ("", "ai.onnx"):
        return False
    quantize = _only_quantize(node, consumers, outputs)
    if quantize is None:
        return False
    scale = _constant(quantize.input[1], constants)
    has_zero_point = len(quantize.input) > 2 and bool(quantize.input[2])
    zero_point = _constant(quantize.input[2], constants) if has_zero_point else None
    if scale is None or scale.size != 1 or (has_zero_point and (zero_point is None or zero_point.size != 1)):
        return False
    dtype = constants[quantize.input[2]].data_type if has_zero_point else _UINT8
    known, lo, hi = _clip_bounds(node, constants)
    z = 0 if zero_point is None else int(zero_point.item())
    return known and redundant_clip(lo, hi, float(scale.item()), z, dtype)


def drop_export_metadata(model: Any) -> int:
    """Clear the debug metadata torch.onnx's exporter attaches to an ``onnx_ir`` model before it
    is saved: every node's ``metadata_props`` (``namespace`` and ``pkg.torch.onnx.*``: the FX
    node, its stack trace, module path and class hierarchy) in the main graph, its subgraphs and
    the model's functions, and the graph's ``pkg.torch.*`` entries (the exported program's graph
    signature). ONNX Runtime reads none of them: nodes, initializers, names, shapes and opsets
    are untouched. Returns how many entries were removed."""
    removed = 0
    graphs = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in graph.all_nodes():
            removed += len(node.metadata_props)
            node.metadata_props.clear()
    for key in [k for k in model.graph.metadata_props if k.startswith(_TORCH_KEYS)]:
        del model.graph.metadata_props[key]
        removed += 1
    return removed


def quantize_constant_muls(model: Any) -> int:
    """In an ``onnx_ir`` model, give each ``Mul`` of a dequantized tensor by a scalar constant
    whose only consumer is a ``QuantizeLinear`` (``DequantizeLinear -> Mul(c) -> QuantizeLinear``,
    e.g. attention's ``scores * d ** -0.5``, a scalar the PT2E recipe cannot annotate) a
    quantized constant: ``DequantizeLinear(q, scale, zero_point)`` of the dtype of the other
    input's, holding ``c`` exactly (``q = 1, scale = c, zero_point = 0``; for ``c < 0`` the
    scale is ``-c`` and ``q - zero_point = -1``). The Mul is then a node unit ORT runs as
    ``QLinearMul``, as in ``quantize_static``'s model, instead of a float Mul between a
    DequantizeLinear and a QuantizeLinear; the value multiplied is ``c`` exactly either way
    (ORT's outputs were bit-equal on the tests' and the benchmark's models). Returns how many."""
    import numpy as np
    import onnx_ir as ir

    graph = model.graph
    outputs = set(graph.outputs)
    done = 0
    for node in list(graph):
        if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        result = node.outputs[0]
        users = list(result.uses())
        if result in outputs or len(users) != 1 or users[0].node.op_type != "QuantizeLinear":
            continue
        out_scale = users[0].node.inputs[1].const_value if len(users[0].node.inputs) > 1 else None
        if out_scale is None or out_scale.size != 1:  # QLinearMul: per-tensor output
            continue
        for a, b in ((0, 1), (1, 0)):
            x, c = node.inputs[a], node.inputs[b]
            dequantize = x.producer() if x is not None else None
            if dequantize is None or dequantize.op_type != "DequantizeLinear" or len(dequantize.inputs) < 3:
                continue
            zero_point = dequantize.inputs[2].const_value if dequantize.inputs[2] is not None else None
            scale = dequantize.inputs[1].const_value if dequantize.inputs[1] is not None else None
            value = c.const_value if c is not None else None
            if zero_point is None or scale is None or value is None or scale.size != 1:
                continue
            dtype = {ir.DataType.UINT8: np.uint8, ir.DataType.INT8: np.int8}.get(zero_point.dtype)
            constant = value.numpy()
            if dtype is None or value.dtype != ir.DataType.FLOAT or constant.size != 1:
                continue
            v = float(constant.reshape(()))
            if v == 0.0 or not np.isfinite(v):
                continue
            q, z = (1, 0) if v > 0 else ((0, 1) if dtype is np.uint8 else (-1, 0))
            name = f"{node.name or result.name}_constant"
            inputs = []
            for suffix, array in (
                ("q", np.array(q, dtype)),
                ("scale", np.array(abs(v), np.float32)),
                ("zp", np.array(z, dtype)),
            ):
                initializer = ir.Value(name=f"{name}_{suffix}", const_value=ir.tensor(array, name=f"{name}_{suffix}"))
                graph.register_initializer(initializer)
                inputs.append(initializer)
            dq = ir.Node("", "DequantizeLinear", inputs, name=f"{name}_dq", num_outputs=1)
            dq.outputs[0].name = f"{name}_dq"
            graph.insert_before(node, dq)
            node.replace_input_with(b, dq.outputs[0])
            if c.is_initializer() and not list(c.uses()):
                graph.initializers.pop(c.name)
            done += 1
            break
    return done


def before_save(model: Any, keep_metadata: bool = False) -> None:
    """What :func:`~quantweave_onnxruntime.to_onnx` does to the exported ``onnx_ir`` model before
    writing it: :func:`quantize_constant_muls`, then :func:`drop_export_metadata` (unless
    ``keep_metadata``)."""
    quantize_constant_muls(model)
    if not keep_metadata:
        drop_export_metadata(model)

"""Post-processing of the exported ONNX file: Clips that the next QuantizeLinear makes redundant.

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

__all__ = ["drop_clips_before_quantize", "redundant_clip"]

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


def drop_clips_before_quantize(path: str | Path) -> int:
    """Remove from the ONNX model at ``path`` each Clip whose only consumer is a per-tensor
    QuantizeLinear that makes it redundant (:func:`redundant_clip`), and the Clip bounds no
    node reads any more; the file is rewritten only when a Clip was removed. Returns how many."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    constants: dict[str, Any] = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    consumers: dict[str, list[Any]] = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    outputs = {o.name for o in graph.output}
    dropped = []
    for node in graph.node:
        if node.op_type != "Clip" or node.domain not in ("", "ai.onnx") or node.output[0] in outputs:
            continue
        users = consumers[node.output[0]]
        if len(users) != 1 or users[0].op_type != "QuantizeLinear":
            continue
        quantize = users[0]
        scale = _constant(quantize.input[1], constants)
        has_zero_point = len(quantize.input) > 2 and bool(quantize.input[2])
        zero_point = _constant(quantize.input[2], constants) if has_zero_point else None
        if scale is None or scale.size != 1 or (has_zero_point and (zero_point is None or zero_point.size != 1)):
            continue
        dtype = constants[quantize.input[2]].data_type if has_zero_point else _UINT8
        known, lo, hi = _clip_bounds(node, constants)
        z = 0 if zero_point is None else int(zero_point.item())
        if known and redundant_clip(lo, hi, float(scale.item()), z, dtype):
            quantize.input[0] = node.input[0]
            dropped.append(node)
    if not dropped:
        return 0
    bounds = {name for node in dropped for name in node.input[1:] if name}
    for node in dropped:
        graph.node.remove(node)
    still_read = {name for node in graph.node for name in node.input}
    for initializer in [t for t in graph.initializer if t.name in bounds and t.name not in still_read]:
        graph.initializer.remove(initializer)
    onnx.save(model, str(path))
    return len(dropped)

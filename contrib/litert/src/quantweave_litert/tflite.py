"""``to_tflite``: a quantweave-quantized model as a LiteRT (.tflite) flatbuffer.

The quantization is quantweave's: the model is exported, annotated by a quantweave
quantizer (normally :class:`~quantweave_litert.LiteRTQuantizer`), prepared, calibrated and
converted with ``quantweave.convert_pt2e(..., fold_quantize=False)``. That converted model,
with its ``quantized_decomposed`` quantize/dequantize ops, is handed to
``litert_torch.convert(model, example_inputs, quant_config=QuantConfig(pt2e_quantizer=...))``:
litert-torch 0.10 does *not* run a PT2E flow of its own on the model it is given; it exports
it, lowers each quantize/dequantize pair to a quantized type, and reads from the
``pt2e_quantizer`` only ``global_config.is_dynamic`` (STATIC or DYNAMIC q/dq conversion).
Weights must stay float followed by quantize -> dequantize: litert-torch 0.10 rejects folded
int8 weights (``'stablehlo.uniform_dequantize' op operand #0 must be ... quantized values,
but got 'tensor<...xi8>'``), which :func:`to_tflite` reports before calling it.

litert-torch is an optional extra (``pip install "quantweave-litert[litert]"``), imported
only when :func:`to_tflite` or :func:`tflite_ops` is called.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.authoring import dequantize_ops, module_attr, quantize_ops

from .quantizer import LiteRTQuantizer

__all__ = ["TFLiteOp", "TFLiteTensor", "quantize", "tflite_ops", "to_tflite"]

_INSTALL_HINT = (
    'install the optional extra: pip install torch==2.13.0 && pip install "quantweave-litert[litert]" '
    "(litert-torch==0.10.0; install the pinned torch first so pip keeps the CPU build)"
)


def _import_litert() -> tuple[Any, Any]:
    try:
        import litert_torch
        from litert_torch.quantize.quant_config import QuantConfig
    except ImportError as exc:
        raise ImportError(f"quantweave_litert.to_tflite needs litert-torch: {_INSTALL_HINT}") from exc
    return litert_torch, QuantConfig


def quantize(
    model: torch.nn.Module,
    example_inputs: Sequence[Any],
    quantizer: qw.Quantizer,
    calibration: Iterable[Sequence[Any]] | None = None,
) -> GraphModule:
    """Export ``model``, prepare it with ``quantizer``, run ``calibration`` (input tuples;
    default: the example inputs once) and convert with ``fold_quantize=False``: the form
    :func:`to_tflite` converts."""
    exported = torch.export.export(model, tuple(example_inputs)).module()
    prepared = qw.prepare_pt2e(exported, quantizer)
    for batch in [tuple(example_inputs)] if calibration is None else calibration:
        prepared(*batch)
    return qw.convert_pt2e(prepared, fold_quantize=False)


def _is_constant(node: Any, cache: dict[Node, bool]) -> bool:
    if not isinstance(node, Node):
        return True
    if node not in cache:
        if node.op == "get_attr":
            cache[node] = True
        elif node.op == "call_function" and node.all_input_nodes:
            cache[node] = all(_is_constant(n, cache) for n in node.all_input_nodes)
        else:
            cache[node] = False
    return cache[node]


def conversion_mode(converted: GraphModule) -> bool:
    """True (dynamic) when no activation is quantized in ``converted`` (only weights are:
    LiteRT's dynamic-range conversion), False (static) otherwise. Raises ``ValueError`` when
    nothing is quantized, or when weights are folded (stored as int8)."""
    quantize, dequantize = quantize_ops(), dequantize_ops()
    cache: dict[Node, bool] = {}
    activations = weights = 0
    for node in converted.graph.nodes:
        if node.op != "call_function":
            continue
        source = node.args[0] if node.args else None
        if node.target in dequantize and isinstance(source, Node) and source.op == "get_attr":
            value = module_attr(converted, str(source.target))
            if isinstance(value, torch.Tensor) and not value.is_floating_point():
                raise ValueError(
                    f"to_tflite: {node.name!r} dequantizes the stored {value.dtype} tensor {source.target!r}: the "
                    "model was converted with folded weights, which litert-torch 0.10 cannot lower "
                    "('stablehlo.uniform_dequantize' expects a quantized type). Convert with "
                    "quantweave.convert_pt2e(prepared, fold_quantize=False)"
                )
        if node.target in quantize:
            if _is_constant(source, cache):
                weights += 1
            else:
                activations += 1
    if not activations and not weights:
        raise ValueError(
            "to_tflite: the model has no quantize ops; pass a float model with quantizer=LiteRTQuantizer(), or a "
            "model converted by quantweave.convert_pt2e(prepared, fold_quantize=False)"
        )
    return activations == 0


def to_tflite(
    model: torch.nn.Module,
    example_inputs: Sequence[Any],
    path: str | os.PathLike[str] | None = None,
    *,
    quantizer: qw.Quantizer | None = None,
    calibration: Iterable[Sequence[Any]] | None = None,
) -> Any:
    """Convert a quantweave-quantized model to LiteRT; returns litert-torch's model object
    (``.model_content()`` gives the flatbuffer bytes; calling it runs the LiteRT interpreter)
    and writes the .tflite to ``path`` when given.

    - ``model`` a float module and ``quantizer`` given: :func:`quantize` first (export,
      prepare, calibrate on ``calibration`` or the example inputs, convert unfolded);
    - ``model`` already converted by ``quantweave.convert_pt2e(prepared, fold_quantize=False)``:
      converted as is.

    Static or dynamic-range conversion follows the model: dynamic when only weights are
    quantized (``LiteRTQuantizer(is_dynamic=True)``). The model's inputs and outputs become
    int8 in a static model (LiteRT feeds and returns the quantized tensors).
    """
    example_inputs = tuple(example_inputs)
    if quantizer is not None:
        if not isinstance(quantizer, qw.Quantizer):
            raise TypeError(f"to_tflite: quantizer must be a quantweave.Quantizer; got {type(quantizer).__name__}")
        converted = quantize(model, example_inputs, quantizer, calibration)
    elif isinstance(model, GraphModule):
        converted = model
    else:
        raise TypeError(
            f"to_tflite: got a {type(model).__name__} and no quantizer; pass quantizer=LiteRTQuantizer() to quantize "
            "it, or a GraphModule converted by quantweave.convert_pt2e(prepared, fold_quantize=False)"
        )
    dynamic = conversion_mode(converted)
    litert_torch, quant_config_cls = _import_litert()
    if converted.training:  # a converted graph ignores the flag; litert-torch warns about it
        converted = copy.copy(converted)  # shares parameters; the caller's module is not touched
        converted.training = False
    # litert-torch 0.10 reads only `.global_config.is_dynamic` from the quantizer it is given
    config = quant_config_cls(pt2e_quantizer=LiteRTQuantizer(is_dynamic=dynamic))
    edge = litert_torch.convert(converted, example_inputs, quant_config=config)
    if path is not None:
        edge.export(os.fspath(path))
    return edge


@dataclass(frozen=True)
class TFLiteTensor:
    """One tensor of a .tflite op: type name (``INT8``, ``FLOAT32``...), shape, and its
    quantization (per-tensor: one scale / zero point; per-channel: one per channel)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]


@dataclass(frozen=True)
class TFLiteOp:
    """One operator of a .tflite subgraph; ``fused_activation`` is ``NONE``, ``RELU``...
    for ops that carry one (None otherwise)."""

    name: str
    inputs: tuple[TFLiteTensor, ...]
    outputs: tuple[TFLiteTensor, ...]
    fused_activation: str | None


def tflite_ops(content: bytes, subgraph: int = 0) -> list[TFLiteOp]:
    """The operators of a .tflite flatbuffer, in execution order, read from the file
    itself (before any delegate rewrites it). Needs ``ai_edge_litert`` (a dependency of
    litert-torch)."""
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError as exc:
        raise ImportError(f"quantweave_litert.tflite_ops needs ai-edge-litert: {_INSTALL_HINT}") from exc

    def names(enum: Any) -> dict[int, str]:
        return {value: key for key, value in vars(enum).items() if not key.startswith("_")}

    op_names, type_names = names(schema.BuiltinOperator), names(schema.TensorType)
    activations = names(schema.ActivationFunctionType)
    model = schema.ModelT.InitFromPackedBuf(content, 0)
    graph = model.subgraphs[subgraph]

    def tensor(index: int) -> TFLiteTensor:
        t = graph.tensors[index]
        q = t.quantization
        scale = () if q is None or q.scale is None else tuple(float(s) for s in q.scale)
        zero_point = () if q is None or q.zeroPoint is None else tuple(int(z) for z in q.zeroPoint)
        name = t.name.decode() if isinstance(t.name, bytes) else str(t.name)
        shape = () if t.shape is None else tuple(int(d) for d in t.shape)
        return TFLiteTensor(name, type_names[t.type], shape, scale, zero_point)

    ops = []
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        fused = getattr(op.builtinOptions, "fusedActivationFunction", None)
        ops.append(
            TFLiteOp(
                op_names.get(builtin, str(builtin)),
                tuple(tensor(i) for i in op.inputs if i >= 0),
                tuple(tensor(i) for i in op.outputs if i >= 0),
                None if fused is None else activations.get(fused, str(fused)),
            )
        )
    return ops

"""Export a converted model to ONNX and run it on ONNX Runtime (the ``runtime`` extra).

onnx, onnxscript and onnxruntime are imported here, on first call, never when the plugin
is loaded.
"""

from __future__ import annotations

import collections
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

__all__ = ["INT8_KERNELS", "export_onnx", "int8_kernels", "ort_session", "to_onnx"]

#: ONNX Runtime ops that run on int8 / uint8 data (what its QDQ node units become)
INT8_KERNELS = frozenset(
    (
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "ConvInteger",
        "QGemm",
        "QLinearAdd",
        "QLinearMul",
        "QLinearConcat",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearSigmoid",
        "QLinearSoftmax",
        "QLinearLeakyRelu",
        "QLinearConvTranspose",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
    )
)


def _missing(what: str, error: ImportError) -> ImportError:
    return ImportError(
        f"quantweave_onnxruntime.{what} needs onnx, onnxscript and onnxruntime: "
        f"pip install 'quantweave-onnxruntime[runtime]' ({error})"
    )


def to_onnx(
    converted: torch.nn.Module,
    example_inputs: tuple[Any, ...],
    path: str | os.PathLike[str],
    dynamic_shapes: Any = None,
    opset_version: int | None = None,
    fold_relu: bool = True,
    verbose: bool = False,
    optimizer: Literal["fold", "full"] = "fold",
    keep_metadata: bool = False,
) -> Path:
    """Write ``converted`` (the result of ``quantweave.convert_pt2e``) to ``path`` as ONNX.

    Uses ``torch.onnx.export(..., dynamo=True)``: quantize / dequantize become
    ``QuantizeLinear`` / ``DequantizeLinear``, int8 weights int8 initializers. Shapes are
    those of ``example_inputs`` unless ``dynamic_shapes`` says otherwise: ``torch.export``'s
    form, e.g. ``{"x": {0: torch.export.Dim("batch")}}`` for a dynamic batch or
    ``{"tokens": {1: torch.export.Dim("seq")}}`` for a dynamic sequence (the ONNX inputs then
    have symbolic dimensions; export the float model with the same ``dynamic_shapes``: the
    converted module checks its input shapes). ``fold_relu``: drop a Relu whose QuantizeLinear
    clamps at zero anyway (zero point the lowest value), and a Clip (relu6 / hardtanh) whose
    QuantizeLinear saturates inside its bounds, as ORT's own quantizer does, so ORT
    finds the op's int8 node unit under any of its rewrites. A dynamically quantized model
    (``ORTQuantizer(is_dynamic=True)``) is written as ORT's ``quantize_dynamic`` writes one:
    ``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul``, which ORT fuses into
    ``DynamicQuantizeMatMul``. ``verbose``: let the exporter print its progress lines (silent
    by default). ``optimizer``: ``"fold"`` (default) runs onnxscript's optimizer without its
    pattern rewriter (constant folding and clean-up: the rewriter's rules changed nothing on our
    Q/DQ graphs and were most of the optimizer's time), ``"full"`` all of it, as
    ``torch.onnx.export`` does (``_optimizer``). The exporter's function registry is built once
    per process and reused, and so are its decomposition tables (a contained shim over torch
    2.13's exporter, ``_torch_onnx_compat``; with ``dynamic_shapes``, or on a torch whose
    exporter differs, the public ``torch.onnx.export`` is called as is).
    ``keep_metadata``: keep the exporter's per-node debug metadata (stack traces, FX nodes,
    module paths; ORT reads none of it), dropped by default; a scalar Mul between a
    DequantizeLinear and a QuantizeLinear gets an exact quantized constant, so ORT runs it as
    QLinearMul (``_onnx_cleanup.before_save``).
    ``converted`` is not modified. Returns the path."""
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"to_onnx: example_inputs must be a tuple of inputs; got {type(example_inputs).__name__}")
    try:
        import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter needs it)
    except ImportError as error:
        raise _missing("to_onnx", error) from None
    from . import _integer_ops, _onnx_cleanup, _optimizer, _torch_onnx_compat

    if optimizer not in _optimizer.OPTIMIZERS:
        raise ValueError(
            f"to_onnx: optimizer must be one of {', '.join(map(repr, _optimizer.OPTIMIZERS))}; got {optimizer!r}"
        )
    target = Path(path)
    if not target.parent.is_dir():
        raise FileNotFoundError(f"to_onnx: directory {str(target.parent)!r} of {str(target)!r} does not exist")

    dynamic = _integer_ops.has_dynamic_quantization(converted)
    with warnings.catch_warnings():
        # a converted GraphModule keeps the train flag export gave it; its graph is already in eval form
        warnings.filterwarnings("ignore", message="Exporting a model while it is in training mode")
        program = _torch_onnx_compat.export(
            converted,
            example_inputs,
            dynamic_shapes=dynamic_shapes,
            opset_version=opset_version,
            custom_translation_table=_integer_ops.translations() if dynamic else None,
            verbose=verbose,
            optimize=False,
        )
    if program is None:  # pragma: no cover - dynamo export always returns its program
        raise RuntimeError("to_onnx: torch.onnx.export returned no program")
    _optimizer.optimize(program, optimizer)
    _onnx_cleanup.before_save(program.model, keep_metadata=keep_metadata)
    program.save(str(target))
    if fold_relu:
        _onnx_cleanup.drop_redundant_activations(target)
    if dynamic:
        _integer_ops.to_integer_ops(target)
    return target


#: the name of :func:`to_onnx` before 0.2 (kept)
export_onnx = to_onnx


def ort_session(
    path: str | os.PathLike[str],
    intra_op_threads: int | None = None,
    optimized_model_path: str | os.PathLike[str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> Any:
    """An ``onnxruntime.InferenceSession`` on the CPU provider for the model at ``path``.

    ``intra_op_threads``: ORT's intra-op thread count (default: ORT's); ``optimized_model_path``:
    where ORT writes the model after its graph optimizations (what :func:`int8_kernels`
    reads); ``options``: other ``SessionOptions`` attributes by name."""
    try:
        import onnxruntime as ort
    except ImportError as error:
        raise _missing("ort_session", error) from None
    if not Path(path).is_file():
        raise FileNotFoundError(f"ort_session: no ONNX model at {str(path)!r}")
    so = ort.SessionOptions()
    if intra_op_threads is not None:
        so.intra_op_num_threads = intra_op_threads
        so.inter_op_num_threads = 1
    if optimized_model_path is not None:
        so.optimized_model_filepath = str(optimized_model_path)
    for name, value in (options or {}).items():
        if not hasattr(so, name):
            raise ValueError(f"ort_session: onnxruntime.SessionOptions has no option {name!r}")
        setattr(so, name, value)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def int8_kernels(path: str | os.PathLike[str]) -> dict[str, int]:
    """Op type -> count in the model ONNX Runtime actually runs (its optimized graph on the
    CPU provider) for the ONNX model at ``path``: every op, so ``QLinearConv`` / ``QGemm``
    (int8 kernels, :data:`INT8_KERNELS`) can be told from ``Conv`` / ``Gemm`` left in float."""
    try:
        import onnx
    except ImportError as error:
        raise _missing("int8_kernels", error) from None
    with tempfile.TemporaryDirectory() as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        ort_session(path, optimized_model_path=optimized)
        model = onnx.load(str(optimized))
    return dict(collections.Counter(node.op_type for node in model.graph.node))

"""quantweave-onnxruntime: ONNX Runtime's QDQ recipe as a quantweave plugin, and export to ONNX.

Importing this package imports neither onnx nor onnxruntime: :func:`to_onnx` (alias
:func:`export_onnx`) and :func:`ort_session` import them on first call (the ``runtime`` extra). Names are imported on
first use, so plugin discovery (which only needs the declarations) stays cheap.
"""

from __future__ import annotations

from quantweave.authoring import lazy_exports

#: The distribution's version (single source: pyproject.toml reads it from here).
__version__ = "0.1.0"

__all__ = [
    "ORTConfig",
    "ORTQuantizer",
    "declared_capabilities",
    "export_onnx",
    "int8_kernels",
    "ort_session",
    "to_onnx",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ORTConfig": "_config",
        "ORTQuantizer": "quantizer",
        "declared_capabilities": "_capabilities",
        "export_onnx": "_export",
        "int8_kernels": "_export",
        "ort_session": "_export",
        "to_onnx": "_export",
    },
)

"""quantweave-litert: the LiteRT (TFLite) int8 scheme as a quantweave plugin (see README)."""

from .quantizer import LiteRTQuantizer
from .tflite import TFLiteOp, TFLiteTensor, tflite_ops, to_tflite

#: The distribution's version (single source: pyproject.toml reads it from here).
__version__ = "0.1.0"

__all__ = ["LiteRTQuantizer", "TFLiteOp", "TFLiteTensor", "tflite_ops", "to_tflite"]

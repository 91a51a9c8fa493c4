"""Entry point of quantweave-onnxruntime (group ``quantweave``, name ``onnxruntime``).

Loading the plugin imports only the declarations (no onnx, no onnxruntime); the quantizer
module is imported when a quantizer is first built.
"""

from __future__ import annotations

from typing import Any

from quantweave.plugin_api import Quantizer, QuantizerInfo, hookimpl

from ._capabilities import declared_capabilities

QUANTWEAVE_PLUGIN_API = 2


def make_quantizer(**options: Any) -> Quantizer:
    """Factory registered for ``onnxruntime``: ``ORTQuantizer(**options)``."""
    from .quantizer import ORTQuantizer

    return ORTQuantizer(**options)


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name="onnxruntime",
            factory=make_quantizer,
            capabilities=declared_capabilities(),
            description="ONNX Runtime QDQ: uint8 affine activations (int8 option), int8 per-channel weights, "
            "quantized outputs; export_onnx() writes QuantizeLinear / DequantizeLinear",
        )
    ]

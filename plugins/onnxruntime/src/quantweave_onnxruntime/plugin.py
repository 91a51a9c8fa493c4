"""Entry point of quantweave-onnxruntime (group ``quantweave``, name ``onnxruntime``).

Loading the plugin imports only the declarations (no onnx, no onnxruntime); the quantizer
module is imported when a quantizer is first built.
"""

from __future__ import annotations

from typing import Any

from quantweave.plugin_api import PatternSpec, Quantizer, QuantizerInfo, hookimpl

from ._capabilities import declared_capabilities
from ._patterns import patterns

QUANTWEAVE_PLUGIN_API = 2


def make_quantizer(**options: Any) -> Quantizer:
    """Factory registered for ``onnxruntime``: ``ORTQuantizer(**options)``."""
    from .quantizer import ORTQuantizer

    return ORTQuantizer(**options)


@hookimpl
def quantweave_patterns() -> list[PatternSpec]:
    return patterns()


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name="onnxruntime",
            factory=make_quantizer,
            capabilities=(
                declared_capabilities() + declared_capabilities(is_dynamic=True) + declared_capabilities(is_qat=True)
            ),
            description="ONNX Runtime QDQ: uint8 affine activations (int8 option), int8 per-channel weights, "
            "quantized outputs; static, dynamic (MatMulInteger) and QAT; to_onnx() writes QuantizeLinear / "
            "DequantizeLinear",
            mode_options={"dynamic": {"is_dynamic": True}, "qat": {"is_qat": True}},
        )
    ]

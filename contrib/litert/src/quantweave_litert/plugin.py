"""Entry point of quantweave-litert (group ``quantweave``, name ``litert``)."""

from __future__ import annotations

from quantweave.plugin_api import QuantizerInfo, hookimpl

from .quantizer import CAPABILITIES, LiteRTQuantizer

#: The quantweave plugin-API version this plugin targets.
QUANTWEAVE_PLUGIN_API = 2


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name="litert",
            factory=LiteRTQuantizer,
            capabilities=CAPABILITIES,
            description=(
                "LiteRT (TFLite) int8: affine activations, symmetric per-channel weights, fixed sigmoid/softmax "
                "qparams; dynamic-range linear (weight_only); to_tflite() converts with litert-torch"
            ),
            mode_options={"weight_only": {"is_dynamic": True}},
        )
    ]

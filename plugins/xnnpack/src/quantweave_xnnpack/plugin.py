"""Entry point of quantweave-xnnpack (group ``quantweave``, name ``xnnpack``).

Loading the plugin imports the rule table (the declarations are read off its rows, which
name the matchers); the quantizer module and the ExecuTorch lowering are imported when first used.
"""

from __future__ import annotations

from typing import Any

from quantweave.plugin_api import Quantizer, QuantizerInfo, hookimpl

from ._capabilities import declared_capabilities

QUANTWEAVE_PLUGIN_API = 2


def make_quantizer(**options: Any) -> Quantizer:
    """Factory registered for ``xnnpack``: an ``XNNPACKQuantizer`` whose global config is
    ``get_symmetric_quantization_config(**options)`` (same options and defaults:
    ``is_per_channel``, ``is_qat``, ``is_dynamic``, ``act_qmin``, ``act_qmax``,
    ``weight_qmin``, ``weight_qmax``, ``act_granularity``, ``weight_group_size``)."""
    from .quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(**options))


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name="xnnpack",
            factory=make_quantizer,
            capabilities=(
                declared_capabilities() + declared_capabilities(is_dynamic=True) + declared_capabilities(is_qat=True)
            ),
            description=(
                "XNNPACK (ExecuTorch): int8 per-tensor activations, int8 symmetric weights (per-tensor; "
                "is_per_channel=True for per-channel); to_executorch() lowers with the XNNPACK partitioner"
            ),
            mode_options={"dynamic": {"is_dynamic": True}, "qat": {"is_qat": True}},
        )
    ]

"""Entry point of quantweave-x86 (group ``quantweave``, name ``x86``).

Loading the plugin imports only the declarations; the quantizer module is imported when a
quantizer is first built.
"""

from __future__ import annotations

from typing import Any

from quantweave.plugin_api import Quantizer, QuantizerInfo, hookimpl

from ._capabilities import declared_capabilities

QUANTWEAVE_PLUGIN_API = 2


def make_quantizer(**options: Any) -> Quantizer:
    """Factory registered for ``x86``: ``X86InductorQuantizer(**options)``."""
    from .quantizer import X86InductorQuantizer

    return X86InductorQuantizer(**options)


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name="x86",
            factory=make_quantizer,
            capabilities=(
                declared_capabilities(is_dynamic=False)
                + declared_capabilities(is_dynamic=True)
                + declared_capabilities(is_qat=True)
            ),
            description="X86 Inductor: uint8 per-tensor activations, int8 per-channel weights; lower() compiles",
            mode_options={"dynamic": {"is_dynamic": True}, "qat": {"is_qat": True}},
        )
    ]

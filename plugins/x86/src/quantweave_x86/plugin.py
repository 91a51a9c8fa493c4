"""Entry point of quantweave-x86 (group ``quantweave``, name ``x86``)."""

from __future__ import annotations

from quantweave.hookspecs import hookimpl
from quantweave.registry import QuantizerInfo

from .quantizer import X86InductorQuantizer, declared_capabilities

QUANTWEAVE_PLUGIN_API = 1


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name="x86",
            factory=X86InductorQuantizer,
            capabilities=declared_capabilities(is_dynamic=False) + declared_capabilities(is_dynamic=True),
            description="X86 Inductor: uint8 per-tensor activations, int8 per-channel weights; lower() compiles",
            mode_options={"dynamic": {"is_dynamic": True}},
        )
    ]

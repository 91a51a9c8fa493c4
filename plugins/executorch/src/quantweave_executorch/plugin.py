"""Entry point of quantweave-executorch (group ``quantweave``, name ``executorch``).

Loading the plugin imports only the declarations (this package's and its members'); the
recipe and its member quantizers are imported when a quantizer is first built.
"""

from __future__ import annotations

from typing import Any

from quantweave.plugin_api import Quantizer, QuantizerInfo, hookimpl

from ._capabilities import declared_capabilities

QUANTWEAVE_PLUGIN_API = 2


def make_quantizer(**options: Any) -> Quantizer:
    """Factory registered for ``executorch``: ``ExecuTorchQuantizer(**options)`` (``preset``
    ``"llm"`` (default) or ``"vision"``; for ``"llm"``: ``embedding_bits``,
    ``embedding_group_size``, ``embedding_symmetric``, ``linear_bits``, ``tied``)."""
    from .quantizer import ExecuTorchQuantizer

    return ExecuTorchQuantizer(**options)


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name="executorch",
            factory=make_quantizer,
            capabilities=declared_capabilities("llm") + declared_capabilities("vision"),
            description=(
                "ExecuTorch recipes: 'llm' = 8-bit (or 4-bit group-wise) embedding tables from quantweave-embedding "
                "+ dynamic per-channel linears from quantweave-xnnpack; 'vision' = static per-channel XNNPACK; "
                "to_executorch() lowers to embedding_byte / embedding_4bit and XNNPACK delegates"
            ),
            # one recipe mixes modes: each mode is checked on the part of the recipe that serves it
            mode_options={
                "weight_only": {"linear_bits": None},
                "dynamic": {"embedding_bits": None},
                "static": {"preset": "vision"},
            },
        )
    ]

"""Entry point of quantweave-embedding (group ``quantweave``, name ``embedding``).

Loading the plugin imports only the declarations; the quantizer module is imported when a
quantizer is first built.
"""

from __future__ import annotations

from typing import Any

from quantweave.plugin_api import Quantizer, QuantizerInfo, hookimpl

from ._capabilities import declared_capabilities

QUANTWEAVE_PLUGIN_API = 2


def make_quantizer(**options: Any) -> Quantizer:
    """Factory registered for ``embedding``: ``EmbeddingQuantizer(**options)`` (``bits=8``,
    ``group_size=None``, ``symmetric=None``, ``tied="share"``)."""
    from .quantizer import EmbeddingQuantizer

    return EmbeddingQuantizer(**options)


def make_4bit_quantizer(**options: Any) -> Quantizer:
    """Factory registered for ``embedding_4bit``: ``EmbeddingQuantizer(bits=4, **options)``
    (``group_size`` 32 unless given)."""
    from .quantizer import EmbeddingQuantizer

    return EmbeddingQuantizer(**{"bits": 4, **options})


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name="embedding",
            factory=make_quantizer,
            capabilities=declared_capabilities(),
            description=(
                "embedding tables weight-only: uint8 per row with float scale and zero point (ExecuTorch "
                "embedding_byte); bits=4, group_size=32/64/128 for 4-bit group-wise tables"
            ),
            mode_options={"weight_only": {}},
        ),
        QuantizerInfo(
            name="embedding_4bit",
            factory=make_4bit_quantizer,
            capabilities=declared_capabilities(bits=4),
            description=(
                "embedding tables weight-only, 4-bit: values in [-8, 7] with a scale per row and group of 32 "
                "(group_size=64/128; symmetric=False adds zero points), ExecuTorch embedding_4bit once packed"
            ),
            mode_options={"weight_only": {}},
        ),
    ]

"""quantweave-embedding: weight-only quantization of embedding tables, as a quantweave plugin.

``EmbeddingQuantizer`` quantizes the tables of ``nn.Embedding`` / ``F.embedding``
(``aten.embedding``): 8-bit per row (ExecuTorch's ``embedding_byte`` form) or 4-bit
group-wise (``embedding_4bit`` once packed; ``quantweave-executorch`` lowers both).
Names are imported on first use, so plugin discovery (which only needs the declarations)
stays cheap.
"""

from __future__ import annotations

from quantweave.authoring import lazy_exports

__version__ = "0.1.0"

__all__ = ["EmbeddingConfig", "EmbeddingQuantizer", "declared_capabilities"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {"EmbeddingConfig": "quantizer", "EmbeddingQuantizer": "quantizer", "declared_capabilities": "_capabilities"},
)

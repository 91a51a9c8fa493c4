"""quantweave-embedding: weight-only quantization of embedding tables, as a quantweave plugin.

``EmbeddingQuantizer`` quantizes the tables of ``nn.Embedding`` / ``F.embedding``
(``aten.embedding``): 8-bit per row (ExecuTorch's ``embedding_byte`` form) or 4-bit
group-wise (``embedding_4bit`` once packed; ``quantweave-executorch`` lowers both).
Names are imported on first use, so plugin discovery (which only needs the declarations)
stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = ["EmbeddingConfig", "EmbeddingQuantizer", "declared_capabilities"]

_WHERE = {
    "EmbeddingConfig": "quantizer",
    "EmbeddingQuantizer": "quantizer",
    "declared_capabilities": "_capabilities",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

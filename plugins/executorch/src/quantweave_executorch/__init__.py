"""quantweave-executorch: ExecuTorch recipes composed from quantweave plugins, and lowering.

``ExecuTorchQuantizer("llm")`` composes quantweave-xnnpack (dynamic per-channel linears) and
quantweave-embedding (8-bit or 4-bit group-wise tables) through their public classes;
``ExecuTorchQuantizer("vision")`` is static per-channel XNNPACK. ``to_executorch`` lowers a
converted model: tables become ExecuTorch's ``embedding_byte`` / ``embedding_4bit``, linears
XNNPACK delegates (needs the ``executorch`` extra, imported only then).
``capability_table_text`` / ``capability_table_json`` print a composition's capability
table with the plugin that serves each pattern and what is shadowed.
Names are imported on first use, so plugin discovery stays cheap.
"""

from __future__ import annotations

from quantweave.authoring import lazy_exports

__version__ = "0.1.0"

__all__ = [
    "EmbeddingLowering",
    "ExecuTorchLLMProgram",
    "ExecuTorchQuantizer",
    "capability_table_json",
    "capability_table_records",
    "capability_table_text",
    "declared_capabilities",
    "pack_int4",
    "rewrite_embeddings",
    "to_executorch",
    "unpack_int4",
]

_WHERE = {
    "EmbeddingLowering": "_lowering",
    "ExecuTorchLLMProgram": "_lowering",
    "pack_int4": "_lowering",
    "rewrite_embeddings": "_lowering",
    "to_executorch": "_lowering",
    "unpack_int4": "_lowering",
    "ExecuTorchQuantizer": "quantizer",
    "capability_table_json": "_table",
    "capability_table_records": "_table",
    "capability_table_text": "_table",
    "declared_capabilities": "_capabilities",
}


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)

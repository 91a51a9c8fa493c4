"""quantweave-xnnpack: the XNNPACK quantizer of ExecuTorch as a quantweave plugin.

``XNNPACKQuantizer`` / ``get_symmetric_quantization_config`` annotate for XNNPACK with
the semantics of ExecuTorch 1.5.1's quantizer, matched on the exported aten graph;
``to_executorch`` lowers a converted model with ExecuTorch's XNNPACK partitioner (the
optional extra ``quantweave-xnnpack[executorch]``, imported only when it is called); its steps
``lower_to_edge`` (export + partition, returning what was delegated as a ``Delegation``),
``import_executorch``, ``op_name`` and ``is_plumbing`` are public for other lowerings.
``get_8da4w_config(group_size)`` is ExecuTorch's 8da4w for linears (dynamic per-token int8
activations, int4 group-wise weights; XNNPACK's blockwise 4-bit kernels once lowered);
``linear_weights_text(prepared)`` says which linear got which weights (or why it stayed float).
Names are imported on first use, so plugin discovery (which only needs the declarations)
stays cheap.
"""

from __future__ import annotations

from quantweave.authoring import lazy_exports

__version__ = "0.1.0"

__all__ = [
    "ACT_GRANULARITIES",
    "Delegation",
    "ExecuTorchNotInstalledError",
    "ExecuTorchProgram",
    "LoadedProgram",
    "XNNPACKQuantizer",
    "declared_capabilities",
    "get_8da4w_config",
    "get_symmetric_quantization_config",
    "import_executorch",
    "is_plumbing",
    "linear_weights",
    "linear_weights_text",
    "lower_to_edge",
    "op_name",
    "to_executorch",
]

_WHERE = {
    "Delegation": "_executorch",
    "ExecuTorchNotInstalledError": "_executorch",
    "ExecuTorchProgram": "_executorch",
    "LoadedProgram": "_executorch",
    "import_executorch": "_executorch",
    "is_plumbing": "_executorch",
    "lower_to_edge": "_executorch",
    "op_name": "_executorch",
    "to_executorch": "_executorch",
    "ACT_GRANULARITIES": "quantizer",
    "XNNPACKQuantizer": "quantizer",
    "get_symmetric_quantization_config": "quantizer",
    "declared_capabilities": "_capabilities",
    "get_8da4w_config": "_blockwise",
    "linear_weights": "_blockwise",
    "linear_weights_text": "_blockwise",
}


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)

"""quantweave-xnnpack: the XNNPACK quantizer of ExecuTorch as a quantweave plugin.

``XNNPACKQuantizer`` / ``get_symmetric_quantization_config`` annotate for XNNPACK with
the semantics of ExecuTorch 1.5.1's quantizer, matched on the exported aten graph;
``to_executorch`` lowers a converted model with ExecuTorch's XNNPACK partitioner (the
optional extra ``quantweave-xnnpack[executorch]``, imported only when it is called).
Names are imported on first use, so plugin discovery (which only needs the declarations)
stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "ACT_GRANULARITIES",
    "ExecuTorchNotInstalledError",
    "ExecuTorchProgram",
    "XNNPACKQuantizer",
    "declared_capabilities",
    "get_symmetric_quantization_config",
    "to_executorch",
]

_WHERE = {
    "ExecuTorchNotInstalledError": "_executorch",
    "ExecuTorchProgram": "_executorch",
    "to_executorch": "_executorch",
    "ACT_GRANULARITIES": "quantizer",
    "XNNPACKQuantizer": "quantizer",
    "get_symmetric_quantization_config": "quantizer",
    "declared_capabilities": "_capabilities",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

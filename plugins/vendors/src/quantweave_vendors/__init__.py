"""quantweave-vendors: the PT2E quantizers vendors publish (ExecuTorch's XNNPACK, Vulkan,
Qualcomm QNN, Arm TOSA / Ethos-U, Cortex-M, Samsung Enn, OpenVINO; litert-torch's
PT2EQuantizer), hosted unmodified as quantweave quantizers.

Importing this package imports no vendor package; names are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The distribution's version (single source: pyproject.toml reads it from here).
__version__ = "0.1.0"

__all__ = ["VENDORS", "HostedQuantizer", "hosted_vendors", "load_pt2e_quantizer_module"]

_WHERE = {
    "VENDORS": "_vendors",
    "HostedQuantizer": "hosted",
    "hosted_vendors": "plugin",
    "load_pt2e_quantizer_module": "_litert",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

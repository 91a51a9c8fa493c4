"""quantweave-vendors: the PT2E quantizers vendors publish (ExecuTorch's XNNPACK, Vulkan,
Qualcomm QNN, Arm TOSA / Ethos-U, Cortex-M, Samsung Enn, OpenVINO; litert-torch's
PT2EQuantizer), hosted unmodified as quantweave quantizers.

Importing this package imports no vendor package; names are imported on first use.
"""

from __future__ import annotations

from quantweave.authoring import lazy_exports

#: The distribution's version (single source: pyproject.toml reads it from here).
__version__ = "0.1.0"

__all__ = ["VENDORS", "HostedQuantizer", "hosted_vendors", "load_pt2e_quantizer_module"]

_WHERE = {
    "VENDORS": "_vendors",
    "HostedQuantizer": "hosted",
    "hosted_vendors": "plugin",
    "load_pt2e_quantizer_module": "_litert",
}


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)

"""quantweave-x86: the X86 Inductor quantizer and int8 lowering, as a quantweave plugin.

Importing this package has no global side effects (no inductor configuration is changed);
:func:`lower` applies freezing only around its own compiled calls. Names are imported on
first use, so plugin discovery (which only needs the declarations) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The distribution's version (single source: pyproject.toml reads it from here).
__version__ = "0.1.1"

__all__ = [
    "LoweredModule",
    "X86InductorQuantizer",
    "cpu_needs_reduce_range",
    "declared_capabilities",
    "get_default_x86_inductor_quantization_config",
    "lower",
]

_WHERE = {
    "LoweredModule": "_lowering",
    "lower": "_lowering",
    "cpu_needs_reduce_range": "_lowering",
    "X86InductorQuantizer": "quantizer",
    "get_default_x86_inductor_quantization_config": "quantizer",
    "declared_capabilities": "_capabilities",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

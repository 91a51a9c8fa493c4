"""quantweave-x86: the X86 Inductor quantizer and int8 lowering, as a quantweave plugin.

Importing this package has no global side effects (no inductor configuration is changed);
:func:`lower` applies freezing only around its own compiled calls. Names are imported on
first use, so plugin discovery (which only needs the declarations) stays cheap.
"""

from __future__ import annotations

from quantweave.authoring import lazy_exports

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

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "LoweredModule": "_lowering",
        "lower": "_lowering",
        "cpu_needs_reduce_range": "_lowering",
        "X86InductorQuantizer": "quantizer",
        "get_default_x86_inductor_quantization_config": "quantizer",
        "declared_capabilities": "_capabilities",
    },
)

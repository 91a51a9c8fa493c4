"""quantweave-x86: the X86 Inductor quantizer and int8 lowering, as a quantweave plugin.

Importing this package has no global side effects (no inductor configuration is changed);
:func:`lower` applies freezing only around its own compiled calls.
"""

from .lower import LoweredModule, lower
from .quantizer import X86InductorQuantizer, declared_capabilities, get_default_x86_inductor_quantization_config

__all__ = [
    "LoweredModule",
    "X86InductorQuantizer",
    "declared_capabilities",
    "get_default_x86_inductor_quantization_config",
    "lower",
]

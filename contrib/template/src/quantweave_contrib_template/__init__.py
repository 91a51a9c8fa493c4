"""quantweave-contrib-template: a quantweave plugin (see README.md)."""

from .quantizer import TemplateQuantizer

#: The distribution's version (single source: pyproject.toml reads it from here).
__version__ = "0.1.1"

__all__ = ["TemplateQuantizer"]

"""A template quantweave plugin (see README)."""

from .quantizer import TemplateQuantizer

#: The distribution's version (single source: pyproject.toml reads it from here).
__version__ = "0.1.1"

__all__ = ["TemplateQuantizer"]

"""A template quantweave plugin (see README)."""

from .quantizer import TemplateQuantizer

__all__ = ["TemplateQuantizer"]

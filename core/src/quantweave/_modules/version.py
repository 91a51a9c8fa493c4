"""The core's version: the single source ([tool.hatch.version] in core/pyproject.toml reads it),
re-exported as ``quantweave.__version__``. Kept here so that modules the package imports can
read it without importing the package itself."""

__version__ = "0.1.1"

"""The lazy ``__init__`` of a plugin package: names imported from their submodule on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for a package that imports its names on first use.

    ``where`` maps each public name to the submodule (relative to ``package``) that defines
    it, so importing the package (what plugin discovery does) imports none of them::

        # quantweave_myplugin/__init__.py
        from quantweave.authoring import lazy_exports

        __all__ = ["MyQuantizer", "lower"]
        __getattr__, __dir__ = lazy_exports(__name__, {"MyQuantizer": "quantizer", "lower": "_lowering"})

    An unknown name raises :class:`AttributeError` naming the package, as a module does;
    ``dir(package)`` lists the lazy names."""
    table = dict(where)
    for name, module in table.items():
        if not isinstance(name, str) or not isinstance(module, str) or not module:
            raise TypeError(f"lazy_exports({package!r}): expected name -> submodule strings; got {name!r}: {module!r}")

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(f".{table[name].lstrip('.')}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(table)

    return __getattr__, __dir__

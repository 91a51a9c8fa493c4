"""A module name kept for one release after its module moved.

``quantweave.fallback`` was both a module and the function ``quantweave`` re-exports from it,
so ``quantweave.fallback`` the attribute was the function and ``quantweave.fallback.<name>``
failed. The module is now :mod:`quantweave.float_fallback`; :func:`alias_module` registers
the old module name in ``sys.modules`` as a stand-in whose attributes are the new module's,
each read with a DeprecationWarning naming the new home. Nothing is a file under the old name,
so importing it never rebinds ``quantweave.fallback`` (the function) to a module.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from typing import Any

__all__ = ["alias_module"]


class _MovedModule(types.ModuleType):
    def __init__(self, old: str, new: str, until: str) -> None:
        super().__init__(old, f"Deprecated: moved to {new} (this name is kept until {until}).")
        self._moved_to = new
        self._until = until

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # tools probing sys.modules (inspect, pytest) get no warning
            raise AttributeError(name)
        new = self._moved_to
        warnings.warn(
            f"the module {self.__name__} moved to {new}: import {name} from {new} ({self.__name__} the module "
            f"goes in {self._until}; {self.__name__} the function is unchanged)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)


def alias_module(old: str, new: str, until: str) -> None:
    """Make ``import old`` / ``from old import name`` reach ``new``, warning on each name read."""
    sys.modules.setdefault(old, _MovedModule(old, new, until))

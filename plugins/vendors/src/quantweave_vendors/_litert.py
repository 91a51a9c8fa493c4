"""Importing litert-torch's PT2E quantizer module without running ``litert_torch/__init__``.

``import litert_torch`` loads its whole converter stack (JAX, the LiteRT converter, ...);
``litert_torch.quantize.pt2e_quantizer`` itself needs only torch and torchao. Python runs a
package's ``__init__`` before any of its submodules, so :func:`load_pt2e_quantizer_module`
locates the two packages with :func:`importlib.util.find_spec` (which reads the file system
and runs nothing), puts *bare* module objects for ``litert_torch`` and
``litert_torch.quantize`` (their ``__path__`` only, no code run) into ``sys.modules`` for
the time of the import, imports ``pt2e_quantizer`` (and the ``pt2e_quantizer_utils`` it
imports) through the ordinary import system, and then takes the bare parents out again.

The loaded modules stay in ``sys.modules`` under their real names, so a later
``import litert_torch`` runs the real ``__init__`` files and reuses them (one
``PT2EQuantizer`` class per process). When ``litert_torch`` is already imported, the module
is imported the ordinary way.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

PACKAGE = "litert_torch"
MODULE = "litert_torch.quantize.pt2e_quantizer"


def module_file() -> Path | None:
    """Where ``litert_torch/quantize/pt2e_quantizer.py`` is, without importing anything."""
    spec = importlib.util.find_spec(PACKAGE) if PACKAGE not in sys.modules else sys.modules[PACKAGE].__spec__
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / "quantize" / "pt2e_quantizer.py"
        if path.is_file():
            return path
    return None


def _bare_package(name: str, path: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__spec__.submodule_search_locations = [str(path)]
    return module


def load_pt2e_quantizer_module() -> types.ModuleType:
    """``litert_torch.quantize.pt2e_quantizer``, imported past its packages' ``__init__``."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    if PACKAGE in sys.modules:  # the real package is imported already: nothing to avoid
        return importlib.import_module(MODULE)
    path = module_file()
    if path is None:
        raise ModuleNotFoundError(f"{MODULE} is not installed (pip install litert-torch)", name=MODULE)
    parents = {PACKAGE: path.parent.parent, f"{PACKAGE}.quantize": path.parent}
    for name, where in parents.items():
        sys.modules[name] = _bare_package(name, where)
    try:
        return importlib.import_module(MODULE)
    finally:
        for name, where in parents.items():
            module = sys.modules.get(name)
            if module is not None and getattr(module, "__file__", None) is None and module.__path__ == [str(where)]:
                del sys.modules[name]

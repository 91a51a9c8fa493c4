"""The ``FILE.py:FUNCTION`` / ``MODULE:FUNCTION`` model factories and ``--option KEY=VALUE``
arguments that ``quantweave compare`` and ``quantweave view`` take (errors name the argument)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CompareError", "call_factory", "load_factory", "parse_options"]


class CompareError(Exception):
    """A bad argument of ``quantweave compare`` / ``view`` (the message names it)."""


def parse_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise CompareError(f"--option {item!r}: expected KEY=VALUE with KEY a Python identifier")
        if key in options:
            raise CompareError(f"--option {key} given twice")
        try:
            options[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            options[key] = text  # a plain string
    return options


def load_factory(spec: str) -> Any:
    """The function named by ``FILE.py:FUNCTION`` or ``MODULE:FUNCTION``."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise CompareError(f"MODEL {spec!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION")
    path = Path(where)
    if where.endswith(".py") or path.is_file():
        if not path.is_file():
            raise CompareError(f"MODEL {spec!r}: no file {where}")
        sys.path.insert(0, str(path.resolve().parent))  # modules next to FILE import, like `python FILE.py`
        module_spec = importlib.util.spec_from_file_location(f"_quantweave_compare_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise CompareError(f"MODEL {spec!r}: cannot load {where} as Python")
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise CompareError(f"MODEL {spec!r}: running {where} failed: {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:
            raise CompareError(f"MODEL {spec!r}: cannot import {where}: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, name, None)
    if factory is None:
        raise CompareError(f"MODEL {spec!r}: {where} defines no {name!r}")
    if not callable(factory):
        raise CompareError(f"MODEL {spec!r}: {name} is a {type(factory).__name__}, not a function")
    return factory


def call_factory(factory: Any, spec: str) -> tuple[Any, list[tuple[Any, ...]]]:
    import torch

    try:
        result = factory()
    except Exception as exc:
        raise CompareError(f"MODEL {spec!r}: calling it failed: {type(exc).__name__}: {exc}") from exc
    expected = "(model, batches): an nn.Module or exported GraphModule, and a list of batches"
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CompareError(f"MODEL {spec!r} returned {type(result).__name__}; expected {expected}")
    model, batches = result
    if not isinstance(model, torch.nn.Module):
        raise CompareError(f"MODEL {spec!r} returned a model of type {type(model).__name__}; expected {expected}")
    if isinstance(batches, (str, bytes)):
        raise CompareError(f"MODEL {spec!r} returned batches of type {type(batches).__name__}; expected {expected}")
    if isinstance(batches, torch.Tensor):
        batches = [(batches,)]
    elif isinstance(batches, tuple):
        batches = [batches]
    elif isinstance(batches, (list, Sequence)) or hasattr(batches, "__iter__"):
        batches = [b if isinstance(b, tuple) else (b,) for b in batches]
    else:
        raise CompareError(f"MODEL {spec!r} returned batches of type {type(batches).__name__}; expected {expected}")
    if not batches:
        raise CompareError(f"MODEL {spec!r} returned no batches; expected {expected}")
    return model, batches

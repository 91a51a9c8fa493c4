"""Module-name and module-type options checked against the model they are applied to.

A quantizer option such as ``set_module_name("blocks.0", config)`` selects nodes through
``node.meta["nn_module_stack"]`` (the modules each node was traced in). A name or type that
no node was traced in selects nothing, silently: :func:`warn_unknown_modules` (re-exported
by :mod:`quantweave.plugin_api`) warns about each, listing close matches.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterable
from typing import Any

from torch.fx import GraphModule

from ..errors import MisuseWarning

__all__ = ["warn_unknown_modules"]

_PREFIX = "L['self']."  # strict export's path prefix


def _stack_entries(model: GraphModule) -> tuple[set[str], dict[str, str]] | None:
    """(module paths, qualified type name -> class name) of every module some node of
    ``model`` was traced in; None when no node records its module stack."""
    paths: set[str] = set()
    types: dict[str, str] = {}
    recorded = False
    for node in model.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            continue
        recorded = True
        for entry in stack.values():
            path, kind = (entry[0], entry[1]) if isinstance(entry, tuple) and len(entry) > 1 else (entry, None)
            paths.add(str(path).removeprefix(_PREFIX))
            if isinstance(kind, type):
                types[f"{kind.__module__}.{kind.__qualname__}"] = kind.__name__
            elif isinstance(kind, str) and kind:
                types[kind] = kind.rsplit(".", 1)[-1]
    return (paths, types) if recorded else None


def _listing(candidates: list[str], wanted: str) -> str:
    close = difflib.get_close_matches(wanted, candidates, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    shown = sorted(candidates)[:12]
    more = f", ... ({len(candidates)} in all)" if len(candidates) > len(shown) else ""
    return "modules of the model: " + (", ".join(repr(c) for c in shown) + more if shown else "none")


def warn_unknown_modules(
    model: GraphModule, option: str, wanted: Iterable[str | type[Any]], *, quantizer: str = ""
) -> list[str | type[Any]]:
    """Warn (:class:`~quantweave.errors.MisuseWarning`) for each module name (a ``str``) or
    module type (a class) in ``wanted`` that no node of ``model`` was traced in, naming
    ``option`` (the setter, e.g. ``"set_module_name"``) and ``quantizer``, and listing close
    matches among the model's module paths or type names (difflib). Returns the unknown
    ones. Says nothing when the graph records no module stacks (nothing to check against).

    Call it from ``annotate`` with the options that select by module::

        warn_unknown_modules(model, "set_module_name", self.module_name_config, quantizer=self.name)
    """
    wanted = list(wanted)
    if not wanted:  # nothing to check: the graph is not scanned (annotate calls this on every prepare)
        return []
    entries = _stack_entries(model)
    if entries is None:
        return []
    paths, types = entries
    who = f"quantizer {quantizer!r}: " if quantizer else ""
    unknown: list[str | type[Any]] = []
    for item in wanted:
        if isinstance(item, type):
            if f"{item.__module__}.{item.__qualname__}" in types:
                continue
            names = sorted(set(types.values()))
            hint = _listing(names, item.__name__).replace("modules of the model", "module types of the model")
            message = f"{option}({item.__name__}) matches no module of this model: no node was traced inside a "
            message += f"{item.__module__}.{item.__qualname__}, so the option has no effect; {hint}"
        else:
            name = str(item)
            if name in paths:
                continue
            message = f"{option}({name!r}) matches no module of this model: no node was traced inside a module "
            message += f"named {name!r}, so the option has no effect; {_listing(sorted(paths - {''}), name)}"
        unknown.append(item)
        warnings.warn(who + message, MisuseWarning, stacklevel=3)
    return unknown

"""Where a node was traced: module paths and types from ``nn_module_stack``, and filters on them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.fx import Node

__all__ = ["NodeFilter", "in_module", "in_module_type", "module_paths", "module_types", "type_name"]

#: A predicate over one node.
NodeFilter = Callable[[Node], bool]

_PREFIX = "L['self']."  # strict export's path prefix


def type_name(module_type: type) -> str:
    """The qualified name ``nn_module_stack`` records for a module class (``"torch.nn.modules.linear.Linear"``)."""
    return f"{module_type.__module__}.{module_type.__qualname__}"


def module_paths(node: Node) -> list[str]:
    """The paths of the submodules ``node`` was traced in, outermost first (``["layers",
    "layers.0"]``; strict export's ``L['self'].`` prefix removed); empty when not recorded."""
    out = []
    for entry in node.meta.get("nn_module_stack", {}).values():
        path = entry[0] if isinstance(entry, tuple) else entry
        out.append(str(path).removeprefix(_PREFIX))
    return out


def module_types(node: Node) -> set[str]:
    """The qualified class names (:func:`type_name`) of the submodules ``node`` was traced in."""
    out = set()
    for entry in node.meta.get("nn_module_stack", {}).values():
        if isinstance(entry, tuple) and len(entry) > 1:
            kind: Any = entry[1]
            out.add(type_name(kind) if isinstance(kind, type) else str(kind))
    return out


def in_module(name: str) -> NodeFilter:
    """A filter accepting the nodes traced inside the submodule ``name`` (at any depth)."""
    return lambda node: name in module_paths(node)


def in_module_type(module_type: type) -> NodeFilter:
    """A filter accepting the nodes traced inside a submodule of class ``module_type``."""
    qualified = type_name(module_type)
    return lambda node: qualified in module_types(node)

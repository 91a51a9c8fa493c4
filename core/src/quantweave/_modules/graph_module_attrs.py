"""Build a GraphModule's attribute tree in fewer Python steps than ``GraphModule.__init__``.

``GraphModule(root, graph)`` copies every ``get_attr`` / ``call_module`` target of ``graph``
from ``root`` with ``torch.fx.graph_module._copy_attr``: for each target it walks the dotted
path from the top on both modules with ``getattr`` (a failed instance lookup, then
``Module.__getattr__``), makes the missing containers, and registers the value through
``Module.__setattr__`` / ``register_buffer``. On the graphs prepare and convert copy (50-60
targets), that is 85-90 % of constructing the module: 0.3 ms of each of the four constructions
in an 8da4w prepare + convert (issue 25).

:func:`construct` makes the same module: ``cls(root, <empty graph like graph>)`` (so
``GraphModule.__init__`` sets everything else from ``root`` and the graph's tracer as usual),
then :class:`AttrCopier` copies the targets in graph order, then the graph is set. The copier
follows ``_copy_attr`` step by step (new ``torch.nn.Module`` containers, parameters registered
as parameters, other tensors as persistent buffers, a path under a module that was installed
whole left alone) with two shortcuts:

- each container path is resolved once (``blocks.0.attn``), not once per target under it; an
  installed target drops the paths under it, so a later target sees what ``_copy_attr`` would;
- a registered child, parameter or buffer is read from, and written into, the module's own
  ``_modules`` / ``_parameters`` / ``_buffers`` dicts, where that is exactly what ``getattr`` /
  ``setattr`` / ``register_buffer`` do: the module's class keeps torch's ``__getattr__``,
  ``__setattr__``, ``register_buffer`` and ``register_parameter``, has no attribute of that
  name, its instance dict has none either, no global registration hook is installed, and (for
  a write) the name is not registered yet. Anything else goes through ``getattr`` / ``setattr``
  / ``register_buffer`` as in torch.

``tests/core/test_graph_module_attrs.py`` builds the modules of exported, prepared and
converted models and of made-up corner cases both ways and compares them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Graph, GraphModule
from torch.nn.modules import module as _module

__all__ = ["AttrCopier", "construct"]

_Module = torch.nn.Module
_GETATTR = _Module.__getattr__
_SETATTR = _Module.__setattr__
_REGISTER_BUFFER = _Module.register_buffer
_REGISTER_PARAMETER = _Module.register_parameter
_HOOKS = tuple(
    getattr(_module, name, None)
    for name in (
        "_global_module_registration_hooks",
        "_global_buffer_registration_hooks",
        "_global_parameter_registration_hooks",
    )
)
_STORES = ("_parameters", "_buffers", "_modules")
_MISSING = object()


def construct(cls: type[GraphModule], root: torch.nn.Module, graph: Graph) -> GraphModule:
    """``cls(root, graph)`` for a GraphModule class whose code is generated lazily (its
    ``recompile`` generates nothing, so setting the graph twice costs nothing), with ``root``'s
    attributes copied by :class:`AttrCopier`. Any other ``root`` (a dict, a module that only
    carries code) is left to ``cls(root, graph)``."""
    if not isinstance(root, _Module) or type(root).__name__ == "_CodeOnlyModule":
        return cls(root, graph)
    module = cls(root, Graph(tracer_cls=graph._tracer_cls, tracer_extras=graph._tracer_extras))
    copier = AttrCopier(root, module)
    for node in graph.nodes:
        if node.op == "get_attr" or node.op == "call_module":
            if not isinstance(node.target, str):
                raise AssertionError(f"Expected node.target to be str, got {type(node.target)}")  # torch's check
            copier.copy(node.target)
    module.graph = graph
    return module


class AttrCopier:
    """Copies qualified attributes (``"blocks.0.attn.q.weight"``) from ``source`` to ``target``
    as ``torch.fx.graph_module._copy_attr`` does, one after the other."""

    def __init__(self, source: torch.nn.Module, target: torch.nn.Module) -> None:
        self.fast = all(isinstance(hooks, dict) and not hooks for hooks in _HOOKS)
        # container path -> (source container, target container); None: a module installed whole
        # at or above this path (nothing under it is copied)
        self._pairs: dict[str, tuple[Any, Any] | None] = {"": (source, target)}

    def copy(self, qualified: str) -> None:
        prefix, _, field = qualified.rpartition(".")
        pair = self._pair(prefix)
        if pair is None:
            return
        source, target = pair
        value = self._get(source, field)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            self._register_buffer(target, field, value)
        else:
            self._set(target, field, value)
        if qualified in self._pairs:  # a container at this path was replaced: what was under it is stale
            stale = qualified + "."
            for path in [p for p in self._pairs if p == qualified or p.startswith(stale)]:
                del self._pairs[path]

    def _pair(self, path: str) -> tuple[Any, Any] | None:
        if path in self._pairs:
            return self._pairs[path]
        parent_path, _, item = path.rpartition(".")
        parent = self._pair(parent_path)
        result: tuple[Any, Any] | None = None
        if parent is not None:
            source = self._get(parent[0], item)
            target = self._get(parent[1], item, None)
            if source is not target:  # _copy_attr: the same object means a parent was installed whole
                if target is None:
                    target = _Module()
                    self._set(parent[1], item, target)
                result = (source, target)
        self._pairs[path] = result
        return result

    def _get(self, owner: Any, name: str, default: Any = _MISSING) -> Any:
        if self.fast and _plain_lookup(owner, name):
            state = owner.__dict__
            for store in _STORES:
                values = state[store]
                if name in values:
                    return values[name]
        if default is _MISSING:
            return getattr(owner, name)
        return getattr(owner, name, default)

    def _set(self, owner: Any, name: str, value: Any) -> None:
        if self.fast and name and _free(owner, name):
            if isinstance(value, torch.nn.Parameter):
                if value.grad_fn is None:
                    owner.__dict__["_parameters"][name] = value
                    return
            elif isinstance(value, _Module):
                owner.__dict__["_modules"][name] = value
                return
        setattr(owner, name, value)

    def _register_buffer(self, owner: Any, name: str, value: torch.Tensor) -> None:
        if self.fast and name and _free(owner, name):
            state = owner.__dict__
            state["_buffers"][name] = value
            state["_non_persistent_buffers_set"].discard(name)
            return
        owner.register_buffer(name, value)


def _plain_lookup(owner: Any, name: str) -> bool:
    """True when ``getattr(owner, name)`` can only come from ``Module.__getattr__``'s dicts."""
    cls = type(owner)
    if cls is _Module:  # the containers: torch's own class, its names read once
        if name in _MODULE_NAMES:
            return False
    elif not (_plain_class(cls) and not hasattr(cls, name)):
        return False
    state = owner.__dict__
    return name not in state and "_modules" in state


def _plain_class(cls: type) -> bool:
    """A Module class with torch's attribute lookup and registration."""
    return (
        issubclass(cls, _Module)
        and cls.__getattr__ is _GETATTR
        and cls.__setattr__ is _SETATTR
        and cls.register_buffer is _REGISTER_BUFFER
        and cls.register_parameter is _REGISTER_PARAMETER
    )


_MODULE_NAMES = frozenset(dir(_Module))


def _free(owner: Any, name: str) -> bool:
    """True when ``name`` is nothing yet on ``owner`` (a module with torch's lookup)."""
    if not _plain_lookup(owner, name):
        return False
    state = owner.__dict__
    return (
        name not in state["_parameters"]
        and name not in state["_buffers"]
        and name not in state["_modules"]
        and "_non_persistent_buffers_set" in state
    )

"""GraphModule code generation deferred inside ExecuTorch's lowering entry points, for the test session
(issue #23; switched on by :func:`tests.executorch_speedups.lowering_speedups`).

``GraphModule.recompile`` generates the graph's Python source and compiles it (``Graph.python_code`` +
``compile``); every ``GraphModule(...)`` and every ``gm.graph = ...`` calls it. ExecuTorch's edge passes
and XNNPACK's per-delegate passes run graphs through ``torch.fx.Interpreter`` (node by node: the
generated ``forward`` is never called) and each one recompiles what it made, so most of that code is
generated and thrown away (a profile of a zoo lowering: ~200 recompiles, ~18 % of its CPU).

Inside a window (:func:`deferred_recompiles`, entered around ``to_edge_transform_and_lower``,
``to_edge``, ``EdgeProgramManager.to_backend`` and ``.to_executorch``) ``recompile`` only marks the
module stale, as torch's own ``_LazyGraphModule`` does for inductor: it sets ``_in_spec`` / ``_out_spec``
as torch does, gives the module's own class (every GraphModule has one) a ``forward`` that recompiles on
the first call (with the generated one's signature: export names a program's inputs after
it), marks its GraphModule children stale too, and returns the ``PythonCode`` on demand.
``code``, ``str()``, pickling (``__reduce__``, ``__reduce_package__``) and ``copy.copy`` recompile a
stale module first. When the outermost window closes, every stale module still alive is recompiled,
so outside the windows every GraphModule is what eager recompiles would have made (its code generated
from its graph as it is then). ``QUANTWEAVE_LAZY_RECOMPILE=0`` turns it off.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from torch.fx import GraphModule
from torch.fx.graph import _PyTreeCodeGen

from tests.executorch_speedups import modules_binding

ENV = "QUANTWEAVE_LAZY_RECOMPILE"

#: the lowering entry points a window is opened around: (module, class or "", function)
ENTRY_POINTS = (
    ("executorch.exir.program._program", "", "to_edge_transform_and_lower"),
    ("executorch.exir.program._program", "", "to_edge"),
    ("executorch.exir.program._program", "EdgeProgramManager", "to_backend"),
    ("executorch.exir.program._program", "EdgeProgramManager", "to_executorch"),
)

_ORIGINAL_RECOMPILE = GraphModule.recompile
#: the module of the entry points: not imported here (~6 s CPU), the windows are put in place by the first
#: recompile after it was imported (every lowering exports first, which recompiles)
ENTRY_MODULE = "executorch.exir.program._program"
_state: dict[str, Any] = {"depth": 0, "stale": weakref.WeakSet(), "stats": collections.Counter(), "pending": None}


def _install_entry_points_if_imported() -> None:
    if _state["pending"] is not None and ENTRY_MODULE in sys.modules:
        _state["pending"]()


def _stale_forward(self: GraphModule, *args: Any, **kwargs: Any) -> Any:
    realize(self)
    return self(*args, **kwargs)


def _signature(gm: GraphModule) -> inspect.Signature:
    """The signature of the ``forward`` a recompile would generate (export names the inputs after it)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter("self", kind)]
    codegen = gm._graph._codegen
    if isinstance(codegen, _PyTreeCodeGen):
        parameters += [inspect.Parameter(name, kind) for name in codegen.pytree_info.orig_args]
        return inspect.Signature(parameters)
    returns: Any = inspect.Signature.empty
    for node in gm._graph.nodes:
        if node.op == "output" and node.type is not None:
            returns = node.type
        if node.op != "placeholder":
            continue
        name, annotation = str(node.target), inspect.Parameter.empty if node.type is None else node.type
        if name.startswith("**"):
            parameters.append(inspect.Parameter(name[2:], inspect.Parameter.VAR_KEYWORD, annotation=annotation))
        elif name.startswith("*"):
            parameters.append(inspect.Parameter(name[1:], inspect.Parameter.VAR_POSITIONAL, annotation=annotation))
        elif node.args:
            parameters.append(inspect.Parameter(name, kind, default=node.args[0], annotation=annotation))
        else:
            parameters.append(inspect.Parameter(name, kind, annotation=annotation))
    return inspect.Signature(parameters, return_annotation=returns)


def _stale_forward_of(gm: GraphModule) -> Callable[..., Any]:
    """:func:`_stale_forward` with the signature of ``gm``'s generated ``forward``."""

    @functools.wraps(_stale_forward)
    def forward(self: GraphModule, *args: Any, **kwargs: Any) -> Any:
        return _stale_forward(self, *args, **kwargs)

    forward.__signature__ = _signature(gm)  # type: ignore[attr-defined]
    forward.__wrapped__ = _stale_forward  # type: ignore[attr-defined]
    return forward


def is_stale(gm: GraphModule) -> bool:
    return getattr(type(gm).__dict__.get("forward"), "__wrapped__", None) is _stale_forward


def realize(gm: GraphModule) -> None:
    """Recompile ``gm`` now if it was marked stale."""
    if is_stale(gm):
        _state["stats"]["recompiles done"] += 1
        _ORIGINAL_RECOMPILE(gm)


class _PythonCodeOnDemand:
    """What a deferred ``recompile`` returns: torch's ``PythonCode``, made on first attribute access."""

    def __init__(self, gm: GraphModule) -> None:
        self._gm = gm
        self._code: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._code is None:
            _state["stats"]["recompiles done"] += 1
            self._code = _ORIGINAL_RECOMPILE(self._gm)
        return getattr(self._code, name)


def _recompile(self: GraphModule) -> Any:
    _install_entry_points_if_imported()
    if not _state["depth"]:
        return _ORIGINAL_RECOMPILE(self)
    _state["stats"]["recompiles deferred"] += 1
    if isinstance(self._graph._codegen, _PyTreeCodeGen):
        self._in_spec = self._graph._codegen.pytree_info.in_spec
        self._out_spec = self._graph._codegen.pytree_info.out_spec
    type(self).forward = _stale_forward_of(self)  # type: ignore[method-assign]
    _state["stale"].add(self)
    for child in self.children():
        if isinstance(child, GraphModule):
            child.recompile()
    return _PythonCodeOnDemand(self)


def _realizing(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: GraphModule, *args: Any, **kwargs: Any) -> Any:
        realize(self)
        return method(self, *args, **kwargs)

    return wrapper


#: GraphModule members that read the generated code: they recompile a stale module first
_READERS = ("__str__", "__reduce__", "__reduce_package__", "__copy__")


@contextlib.contextmanager
def deferred_recompiles() -> Iterator[collections.Counter]:
    """Recompiles deferred for the block (nested blocks: until the outermost one closes); yields the
    counts ("recompiles deferred", "recompiles done")."""
    _state["depth"] += 1
    try:
        yield _state["stats"]
    finally:
        _state["depth"] -= 1
        if not _state["depth"]:
            for gm in list(_state["stale"]):
                if is_stale(gm):
                    _state["stats"]["recompiles at exit"] += 1
                realize(gm)
            _state["stale"] = weakref.WeakSet()


def _windowed(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with deferred_recompiles():
            return function(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def installed() -> Iterator[collections.Counter]:
    """GraphModule's recompile made deferrable and its code readers realizing, and a window around each
    of ExecuTorch's :data:`ENTRY_POINTS` (and every module that bound one by name) once ExecuTorch is
    imported, for the block; yields the counts. Without ExecuTorch no window is ever opened."""
    saved: list[tuple[Any, str, Any]] = []
    outer_stats, _state["stats"] = _state["stats"], collections.Counter()
    outer_pending = _state["pending"]

    def setattr_saved(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, owner.__dict__.get(name, None)))
        setattr(owner, name, value)

    def entry_points() -> None:
        _state["pending"] = None
        for module_name, owner_name, name in ENTRY_POINTS:
            module = sys.modules[module_name]
            if owner_name:
                owner = getattr(module, owner_name)
                setattr_saved(owner, name, _windowed(owner.__dict__[name]))
                continue
            original = getattr(module, name)
            windowed = _windowed(original)
            for other in modules_binding(name, original):
                setattr_saved(other, name, windowed)

    setattr_saved(GraphModule, "recompile", _recompile)
    code = GraphModule.__dict__["code"]
    setattr_saved(GraphModule, "code", property(_realizing(code.fget)))
    for name in _READERS:
        setattr_saved(GraphModule, name, _realizing(GraphModule.__dict__[name]))
    _state["pending"] = entry_points
    _install_entry_points_if_imported()
    try:
        yield _state["stats"]
    finally:
        for owner, name, value in reversed(saved):
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        _state["stats"], _state["pending"] = outer_stats, outer_pending

"""A contained shim over torch.onnx's dynamo exporter: the export ``torch.onnx.export(...,
dynamo=True)`` does, with the ONNX function registry built once per process and opset.

Every ``torch.onnx.export`` call rebuilds that registry from torchlib (about 1 s of CPU on a
quiet core, a third of a small model's whole export) and logs the same torchvision warnings
each time. The public function takes no registry, so :func:`export` calls the exporter's own
entry point with one: two private names of torch 2.13's exporter, checked by
:func:`fast_path_missing`:

- ``torch.onnx._internal.exporter._registration.ONNXRegistry.from_torchlib(opset_version=)``
  and ``.register_op(target, function, is_complex=)``;
- ``torch.onnx._internal.exporter._core.export(model, args, kwargs, *, registry=,
  dynamic_shapes=, verbose=, optimize=, opset_version=)``;
- ``torch._C._dispatch_get_all_op_names()``: the registry maps only the ops registered when it
  is built (``quantized_decomposed`` is registered when torch's quantization code is first
  imported, torchvision's ops when torchvision is), so it is rebuilt whenever more ops are
  registered than when it was built (a float model exported first, then a quantized one);
  precisely, one registry per number of registered ops;
- ``torch.onnx._constants.ONNX_DEFAULT_OPSET`` and ``torch.onnx._internal.exporter._constants.
  TORCHLIB_OPSET``: the opset ``torch.onnx.export`` defaults to, and torchlib's lowest;
- two functions the exporter's decomposition step calls on every export, whose results depend
  only on the registry and the registered ops, reused for the duration of :func:`export` (about
  0.3 s of CPU per export on a quiet core, the same on a CNN as on BERT):
  ``torch.onnx._internal.exporter._decomp.create_onnx_friendly_decomposition_table(ops)`` (the
  decomposition table for the registry's ops: it collects torch's decompositions, among them
  every CompositeImplicitAutograd op of every op namespace) and
  ``torch.export.exported_program._collect_all_valid_cia_ops()`` (that collection again, in
  ``ExportedProgram.run_decompositions``); each is computed once per count of registered ops,
  CompositeImplicitAutograd kernels and torch decompositions (``torch._C.
  _dispatch_get_registrations_for_dispatch_key``, ``torch._decomp.decomposition_table``) and of
  the op packets materialized in each ``torch.ops`` namespace (the collection walks only those:
  an op first reached from Python between two exports changes it), and a copy handed out, the
  originals put back when the export returns;
- the model handed over as an ExportedProgram (:mod:`._program` builds it from the converted
  graph; ``_core.export`` then skips its capture, a second ``torch.export`` of the module), and
  the exporter's decomposition step, ``torch.onnx._internal.exporter._fx_passes.
  decompose_with_registry(program, registry)``, replaced for the duration of that export: the
  program as is when ``ONNXRegistry.is_registered`` holds for every op and none is a
  CompositeImplicitAutograd op torch would decompose (``torch._export.utils._is_cia_op`` and not
  ``_check_valid_to_preserve``, run_decompositions' own tests), else those nodes decomposed
  alone with the exporter's table (``_decomp.get_onnx_implemented_overloads``), else the whole
  program as the exporter does. Where that export raises, the module is exported as before.

Where they are missing or changed, :func:`export` says so once (a warning) and takes the
public ``torch.onnx.export``: the same ONNX file, only slower. tests/onnxruntime checks that
the fast path is taken on the torch the project pins, so a torch that changes them fails
there loudly rather than silently slowing down.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import operator
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from . import _program

__all__ = ["export", "fast_path_missing", "registry"]

_CORE_ARGUMENTS = ("registry", "dynamic_shapes", "verbose", "optimize", "opset_version")


@functools.cache
def fast_path_missing() -> str | None:
    """None when the installed torch has the private exporter API the fast path uses; else
    what is missing (the reason the public, slower path is taken)."""
    try:
        from torch.onnx import _constants
        from torch.onnx._internal.exporter import _constants as _exporter_constants
        from torch.onnx._internal.exporter import _core, _registration
    except ImportError as error:
        return f"torch.onnx's exporter internals cannot be imported ({error})"
    for module, name in ((_constants, "ONNX_DEFAULT_OPSET"), (_exporter_constants, "TORCHLIB_OPSET")):
        if not isinstance(getattr(module, name, None), int):
            return f"{module.__name__}.{name} is missing"
    registry_class = getattr(_registration, "ONNXRegistry", None)
    for name in ("from_torchlib", "register_op", "is_registered"):
        if not hasattr(registry_class, name):
            return f"torch.onnx._internal.exporter._registration.ONNXRegistry.{name} is missing"
    for name in ("_dispatch_get_all_op_names", "_dispatch_get_registrations_for_dispatch_key"):
        if not callable(getattr(torch._C, name, None)):
            return f"torch._C.{name} is missing"
    if not isinstance(getattr(torch.ops, "_dir", None), list) or not isinstance(
        getattr(getattr(torch.ops, "aten", None), "_dir", None), list
    ):
        return "torch.ops._dir (the materialized op namespaces and packets) is missing"
    from torch import _decomp as torch_decompositions

    if not isinstance(getattr(torch_decompositions, "decomposition_table", None), dict):
        return "torch._decomp.decomposition_table is missing"
    from torch._export import utils as export_utils
    from torch.export import exported_program
    from torch.onnx._internal.exporter import _decomp, _fx_passes

    for module, name in (
        (export_utils, "_is_cia_op"),
        (export_utils, "_check_valid_to_preserve"),
        (_decomp, "create_onnx_friendly_decomposition_table"),
        (_decomp, "get_onnx_implemented_overloads"),
        (exported_program, "_collect_all_valid_cia_ops"),
        (_fx_passes, "decompose_with_registry"),
    ):
        if not callable(getattr(module, name, None)):
            return f"{module.__name__}.{name} is missing"
    core_export = getattr(_core, "export", None)
    if core_export is None:
        return "torch.onnx._internal.exporter._core.export is missing"
    parameters = inspect.signature(core_export).parameters
    missing = [name for name in _CORE_ARGUMENTS if name not in parameters]
    if missing:
        return f"torch.onnx._internal.exporter._core.export takes no {', '.join(missing)}"
    return None


def registry(opset_version: int) -> Any:
    """torchlib's registry for ``opset_version``, built once per process and set of registered
    ops (not to be mutated: :func:`export` registers custom translations on a copy)."""
    return _registry(opset_version, len(torch._C._dispatch_get_all_op_names()))


@functools.lru_cache(maxsize=4)
def _registry(opset_version: int, registered_ops: int) -> Any:
    from torch.onnx._internal.exporter import _constants, _registration

    # as torch.onnx.export: torchlib's functions for an older opset are those of its lowest
    return _registration.ONNXRegistry.from_torchlib(opset_version=max(opset_version, _constants.TORCHLIB_OPSET))


_DECOMPOSITION_TABLES: dict[tuple[Any, frozenset[Any]], dict[Any, Any]] = {}
_CIA_OPS: dict[Any, set[Any]] = {}


def _registrations() -> tuple[int, int, int, tuple[tuple[str, int], ...]]:
    """What those results depend on, counted (a few ms): the registered ops, the
    CompositeImplicitAutograd kernels, torch's decompositions, and the op packets materialized
    in each ``torch.ops`` namespace."""
    from torch import _decomp as torch_decompositions

    namespaces = tuple(
        (name, len(namespace._dir))
        for name in list(torch.ops._dir)
        if isinstance(namespace := getattr(torch.ops, name), torch._ops._OpNamespace)
    )
    return (
        len(torch._C._dispatch_get_all_op_names()),
        len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")),
        len(torch_decompositions.decomposition_table),
        namespaces,
    )


@contextlib.contextmanager
def _reused_decomposition_tables() -> Iterator[None]:
    """For the duration of one export: the decomposition table per (registrations, registry
    ops) and torch's CompositeImplicitAutograd op set per registrations (:func:`_registrations`),
    computed once per process (copies handed out; a few entries at most)."""
    from torch.export import exported_program
    from torch.onnx._internal.exporter import _decomp

    make_table = _decomp.create_onnx_friendly_decomposition_table
    collect = exported_program._collect_all_valid_cia_ops

    # each result is also kept under the state after its computation: computing it materializes
    # op packets (the collection walks the namespaces), and the next export starts from that state
    def table(onnx_registered_ops: set[Any]) -> dict[Any, Any]:
        ops = frozenset(onnx_registered_ops)
        key = (_registrations(), ops)
        if key not in _DECOMPOSITION_TABLES:
            result = make_table(onnx_registered_ops)
            _DECOMPOSITION_TABLES[key] = _DECOMPOSITION_TABLES[(_registrations(), ops)] = result
        return dict(_DECOMPOSITION_TABLES[key])

    def cia_ops() -> set[Any]:
        key = _registrations()
        if key not in _CIA_OPS:
            result = set(collect())
            _CIA_OPS[key] = _CIA_OPS[_registrations()] = result
        return set(_CIA_OPS[key])

    _decomp.create_onnx_friendly_decomposition_table = table
    exported_program._collect_all_valid_cia_ops = cia_ops
    try:
        yield
    finally:
        _decomp.create_onnx_friendly_decomposition_table = make_table
        exported_program._collect_all_valid_cia_ops = collect


@contextlib.contextmanager
def _decomposition_skipped(program: Any) -> Iterator[None]:
    """For the duration of one export of ``program`` (built by :mod:`._program`): the exporter's
    decomposition step returns it as is when the registry translates every op of its graph (no
    decomposition is needed: torch's would only re-trace the whole graph), decomposes only the
    nodes of the ops it does not translate where it can (``_program.decompose_nodes``, with the
    exporter's decomposition table), else decomposes it as the exporter does."""
    from torch._export import utils as export_utils
    from torch.onnx._internal.exporter import _decomp, _fx_passes

    decompose = _fx_passes.decompose_with_registry

    def decompose_unless_translated(exported: Any, registry: Any) -> Any:
        if exported is not program:
            return decompose(exported, registry)

        def translated(target: Any) -> bool:
            # what torch's decomposition keeps: an op the registry translates, unless it is a
            # CompositeImplicitAutograd op torch does not preserve (flatten, reshape, dropout...:
            # aliasing or mutating ones, which run_decompositions always decomposes)
            if target is operator.getitem:
                return True
            return bool(registry.is_registered(target)) and (
                not export_utils._is_cia_op(target) or bool(export_utils._check_valid_to_preserve(target))
            )

        untranslated = [n for n in exported.graph.nodes if n.op == "call_function" and not translated(n.target)]
        if not untranslated:
            return exported
        table = _decomp.create_onnx_friendly_decomposition_table(set(_decomp.get_onnx_implemented_overloads(registry)))
        if _program.decompose_nodes(exported, untranslated, table, translated):
            return exported
        return decompose(exported, registry)

    _fx_passes.decompose_with_registry = decompose_unless_translated  # type: ignore[assignment]
    try:
        yield
    finally:
        _fx_passes.decompose_with_registry = decompose


def _with_translations(base: Any, table: Mapping[Callable[..., Any], Callable[..., Any]]) -> Any:
    extended = copy.copy(base)
    extended.functions = {target: list(decomps) for target, decomps in base.functions.items()}
    for torch_op, onnx_op in table.items():
        extended.register_op(torch_op, onnx_op, is_complex=False)
    return extended


def export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    *,
    dynamic_shapes: Any = None,
    opset_version: int | None = None,
    custom_translation_table: Mapping[Callable[..., Any], Callable[..., Any]] | None = None,
    verbose: bool = False,
    optimize: bool = True,
    program_first: bool = True,
) -> Any:
    """``torch.onnx.export(model, args, dynamo=True, ...)``'s ONNXProgram, with the registry
    of :func:`registry`. ``verbose=False``: the exporter prints no progress lines;
    ``optimize``: ``torch.onnx.export``'s argument (False: the caller optimizes).
    ``program_first``: hand the exporter ``model``'s graph as an ExportedProgram
    (:mod:`._program`) instead of letting it trace ``model`` again, and skip its decomposition
    where the registry translates every op; where the graph is not one :mod:`._program` builds,
    or that export raises, the exporter captures ``model`` itself (False: always)."""
    missing = fast_path_missing()
    # dynamic shapes (whose dimension names torch.onnx.export maps onto the ONNX inputs) and a
    # trailing dict of keyword inputs take the public path: only what it does unchanged is sped up
    public = dynamic_shapes is not None or (bool(args) and isinstance(args[-1], dict))
    if missing is not None or public:
        if missing is not None:
            warnings.warn(
                f"quantweave_onnxruntime.to_onnx: {missing}; exporting through torch.onnx.export "
                "(the same model, with the exporter's registry rebuilt on every call)",
                RuntimeWarning,
                stacklevel=3,
            )
        kwargs: dict[str, Any] = {"dynamo": True, "verbose": verbose, "optimize": optimize}
        if dynamic_shapes is not None:
            kwargs["dynamic_shapes"] = dynamic_shapes
        if opset_version is not None:
            kwargs["opset_version"] = opset_version
        if custom_translation_table:
            kwargs["custom_translation_table"] = dict(custom_translation_table)
        return torch.onnx.export(model, args, **kwargs)
    from torch.onnx import _constants
    from torch.onnx._internal.exporter import _core

    opset = _constants.ONNX_DEFAULT_OPSET if opset_version is None else opset_version
    used = registry(opset)
    if custom_translation_table:
        used = _with_translations(used, custom_translation_table)
    with _reused_decomposition_tables():
        if program_first:
            # the converted graph handed over as the program the exporter would capture (no second
            # trace) and, where every op has a translation, not decomposed (no third)
            try:
                program = _program.exported_program(model, args)
                if program is not None:
                    with _decomposition_skipped(program):
                        return _core.export(
                            program,
                            registry=used,
                            verbose=verbose,
                            optimize=optimize,
                            opset_version=opset,
                        )
            except Exception:  # the exporter's own capture below decides (and raises)
                pass
        return _core.export(
            model,
            args,
            None,
            registry=used,
            dynamic_shapes=None,
            verbose=verbose,
            optimize=optimize,
            opset_version=opset,
        )

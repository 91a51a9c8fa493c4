"""torchao's pattern graphs exported once per test session (every env where torchao is installed).

torchao 0.18's ``convert_pt2e`` always runs ``_fold_conv_bn_qat``, and ``prepare_qat_pt2e`` runs
``_fuse_conv_bn_qat``: each builds its match and replacement patterns afresh with
``torch.export`` (``_get_aten_graph_module_for_pattern``) on every call where a batch norm is
left in the graph: 32 exports per such ``convert_pt2e``, about 90 % of a parity test's time
(cProfile: 96 of 102 exports in ``test_bn_folding_coverage_equals_torchao``). The pattern graph
depends only on the pattern function (its code, defaults and closure: the conv function and
flags; torchao passes it wrapped in its ``WrapperModule``) and the shapes and dtypes of the
example inputs, so this memoizes it on exactly that and hands each caller its own deep copy:
torchao's own algorithm runs unchanged on the same graphs. A pattern whose closure or defaults
hold anything else (a tensor, an object) is exported afresh.
"""

from __future__ import annotations

import copy
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

_PLAIN = (bool, int, float, str, type(None), torch.dtype)
_MISS = object()


def _freeze(value: Any, tensors: bool = False) -> Any:
    """A hashable key for an example input (``tensors``: a tensor keyed by its shape and dtype,
    as the export only reads those) or a closure / default value (a tensor there is data the
    graph may hold: _MISS), or _MISS where one is unsafe."""
    if isinstance(value, torch.Tensor):
        if not tensors:
            return _MISS
        return ("tensor", tuple(value.shape), value.dtype, value.requires_grad, value.device.type)
    if isinstance(value, _PLAIN):
        return (type(value).__name__, value)
    if isinstance(value, (types.BuiltinFunctionType, types.FunctionType)) or (
        callable(value) and hasattr(value, "__qualname__")
    ):
        if isinstance(value, types.FunctionType) and (value.__closure__ or value.__defaults__):
            return _MISS
        return ("callable", getattr(value, "__module__", None), value.__qualname__, id(value))
    if isinstance(value, (tuple, list)):
        items = tuple(_freeze(v, tensors) for v in value)
        return _MISS if _MISS in items else (type(value).__name__, items)
    return _MISS


def _key(pattern: Callable, example_inputs: tuple, is_cuda: bool, kwargs: dict) -> Any:
    wrapped = isinstance(pattern, torch.nn.Module)
    if wrapped:  # torchao's WrapperModule(fn): a module holding only the pattern function
        if type(pattern).__name__ != "WrapperModule" or list(pattern.state_dict()) or list(pattern.children()):
            return _MISS
        pattern = pattern.fn
    if not isinstance(pattern, types.FunctionType):
        return _MISS
    parts = [
        wrapped,
        pattern.__code__,
        _freeze(tuple(c.cell_contents for c in pattern.__closure__ or ())),
        _freeze(tuple(pattern.__defaults__ or ())),
        _freeze(tuple(example_inputs), tensors=True),
        is_cuda,
        _freeze(tuple(sorted(kwargs))),
        _freeze(tuple(kwargs[k] for k in sorted(kwargs)), tensors=True),
    ]
    return _MISS if _MISS in parts else tuple(parts)


def memoized(original: Callable, cache: dict, stats: dict) -> Callable:
    def get(pattern: Callable, example_inputs: tuple, is_cuda: bool = False, **kwargs: Any) -> torch.fx.GraphModule:
        key = _key(pattern, example_inputs, is_cuda, kwargs)
        if key is _MISS:
            stats["uncached"] += 1
            return original(pattern, example_inputs, is_cuda, **kwargs)
        if key not in cache:
            stats["exported"] += 1
            cache[key] = original(pattern, example_inputs, is_cuda, **kwargs)
        else:
            stats["reused"] += 1
        return copy.deepcopy(cache[key])

    get.__wrapped__ = original  # type: ignore[attr-defined]
    return get


def patterns_exported_once() -> Iterator[dict]:
    """For a session-scoped autouse fixture (tests/conftest.py): patches torchao's pattern export
    (where torchao is installed) for the session, in torchao's ``utils`` and in every module
    already imported that bound it by name (torchao's ``qat_utils``, ExecuTorch's XNNPACKQuantizer
    utils: its conv-bn annotators export 4-8 patterns on every annotate); yields the counts
    (exported, reused, uncached)."""
    stats = {"exported": 0, "reused": 0, "uncached": 0}
    try:
        from torchao.quantization.pt2e import qat_utils, utils  # noqa: F401  (qat_utils: loaded to be patched)
    except ImportError:
        yield stats
        return
    original = utils._get_aten_graph_module_for_pattern
    get = memoized(original, {}, stats)
    patch = pytest.MonkeyPatch()
    for module in list(sys.modules.values()):
        # what the module itself binds (its __dict__), not getattr: that would ask module stand-ins such as
        # quantweave.fallback (a deprecated name for quantweave.float_fallback) for the name, and warn
        if (getattr(module, "__dict__", None) or {}).get("_get_aten_graph_module_for_pattern") is original:
            patch.setattr(module, "_get_aten_graph_module_for_pattern", get)
    try:
        yield stats
    finally:
        patch.undo()

"""Specs and observers checked against the tensors they meet, at prepare time.

A spec is validated on construction for what it says by itself; only the graph says which
tensor it quantizes. :func:`build_checked_observers` (called by ``prepare_pt2e`` in place of
``build_observers``) checks, before anything is inserted, that each spec fits the tensor of
its edge or node -- and of every edge that shares its observer -- and that the observer
built from it does too:

* ``ch_axis`` of a per-channel spec (None: the observer's default, 0) names a dimension of
  the tensor (``-ndim <= ch_axis < ndim``; a 0-d tensor has none);
* ``group_size`` fits a 2-D tensor whose rows split into groups of that size;
* ``quant_min`` / ``quant_max`` (and a fixed zero point) lie in the range of an integer
  ``dtype`` (specs of other dtypes, placeholders for torchao-style flows, are not
  range-checked); ``qscheme`` is one quantweave knows, per-tensor for a dynamic spec;
* ``prepare_qat_pt2e`` builds fake-quantizers (a quantizer whose static specs all build
  plain observers is a post-training quantizer: error), ``prepare_pt2e`` observers (fake
  quantizers there: :class:`~quantweave.errors.MisuseWarning`).

Each failure is an :class:`~quantweave.errors.AnnotationError` naming the edge or node, the
quantizer, the field, the value and what is allowed -- instead of an ``IndexError`` from
the observer in the middle of calibration.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule

from ..annotation import (
    DerivedQuantizationSpec,
    EdgeOrNode,
    FixedQParamsQuantizationSpec,
    QuantizationSpec,
    QuantizationSpecBase,
)
from ..errors import AnnotationError, MisuseWarning
from ..observers import is_fake_quant_module
from .graph import get_attr_value
from .qtypes import INTEGER_DTYPE_RANGES, QSCHEMES, integer_dtype, is_per_channel
from .sharing import Groups, build_observers, describe, group_specs

__all__ = ["build_checked_observers", "check_specs", "check_observers", "check_observer_kind"]

Label = Callable[[EdgeOrNode], str]


class _DefaultAxis(int):
    """ch_axis=None: the observer's default axis, 0 (shown as such in messages)."""

    def __repr__(self) -> str:
        return "None (the observer's default, 0)"


_DEFAULT_AXIS = _DefaultAxis(0)
_CHECKED = (QuantizationSpec, DerivedQuantizationSpec, FixedQParamsQuantizationSpec)


def build_checked_observers(
    gm: GraphModule,
    specs: dict[EdgeOrNode, QuantizationSpecBase],
    is_qat: bool,
    label: Label,
    groups: Groups | None = None,
) -> dict[EdgeOrNode, torch.nn.Module]:
    """:func:`~quantweave._modules.sharing.build_observers`, with the specs checked against
    their tensors before and the observers after (see the module docstring). ``groups``:
    ``group_specs(specs)`` when the caller has it (computed here otherwise)."""
    if groups is None:
        groups = group_specs(specs)
    check_specs(gm, specs, label, groups)
    observers = build_observers(specs, is_qat=is_qat, groups=groups)
    check_observers(gm, observers, label)
    check_observer_kind(specs, observers, is_qat, label, groups)
    return observers


def tensor_of(gm: GraphModule, key: EdgeOrNode) -> torch.Tensor | None:
    """The (fake) tensor an edge or node carries, when the graph records it."""
    source = key[0] if isinstance(key, tuple) else key
    val = source.meta.get("val")
    if val is None and source.op == "get_attr":
        try:
            val = get_attr_value(gm, str(source.target))
        except AttributeError:
            return None
    return val if isinstance(val, torch.Tensor) else None


def _shape(tensor: torch.Tensor) -> tuple[Any, ...]:
    return tuple(int(d) if isinstance(d, int) else d for d in tensor.shape)


class _Where:
    """Builds the error for one (edge or node, spec): names the edge or node, the quantizer,
    the field, the value and what is allowed."""

    def __init__(self, key: EdgeOrNode, label: Label, subject: str, shared_from: EdgeOrNode | None) -> None:
        self.key, self.label, self.subject, self.shared_from = key, label, subject, shared_from

    def fail(self, field: str, value: Any, allowed: str) -> AnnotationError:
        via = ""
        if self.shared_from is not None:
            via = f" (the spec of {describe(self.shared_from)}, whose observer it shares)"
        what = f"set {self.subject}.{field}={value!r}{via}"
        if not self.subject.endswith("Spec"):  # an observer as built
            what = f"built a {self.subject} with {field}={value!r} (from its spec's observer_or_fake_quant_ctr)"
        by = self.label(self.key)  # named only when it fails
        return AnnotationError(f"{describe(self.key)}: quantizer {by!r} {what}; expected {allowed}")


def check_specs(
    gm: GraphModule, specs: dict[EdgeOrNode, QuantizationSpecBase], label: Label, groups: Groups | None = None
) -> None:
    """Check every concrete spec against its own tensor, and the spec a shared edge takes its
    observer from against the shared edge's tensor (raises AnnotationError). ``groups``:
    ``group_specs(specs)`` when the caller has it."""
    if not specs:
        return
    roots, concrete = group_specs(specs) if groups is None else groups
    first: dict[int, EdgeOrNode] = {}
    for key, spec in specs.items():
        first.setdefault(id(spec), key)
    for key, spec in specs.items():
        tensor = tensor_of(gm, key)
        if isinstance(spec, _CHECKED):
            _check_spec(spec, tensor, _Where(key, label, type(spec).__name__, None))
        group_spec = concrete[roots[key]]
        if group_spec is not spec and isinstance(group_spec, _CHECKED):
            where = _Where(key, label, type(group_spec).__name__, first[id(group_spec)])
            _check_spec(group_spec, tensor, where)


def _check_spec(spec: Any, tensor: torch.Tensor | None, where: _Where) -> None:
    dtype = spec.dtype
    if not isinstance(dtype, torch.dtype):
        raise where.fail("dtype", dtype, "a torch.dtype (torch.int8, torch.uint8, ...)")
    qscheme = spec.qscheme
    if qscheme is not None and qscheme not in QSCHEMES:
        raise where.fail("qscheme", qscheme, "None or one of " + ", ".join(str(q) for q in QSCHEMES))
    bounds = INTEGER_DTYPE_RANGES.get(integer_dtype(dtype))
    if bounds is not None:  # range checks apply to integer dtypes only (others are placeholders)
        _check_range(spec, dtype, bounds, where)
    if getattr(spec, "is_dynamic", False) and is_per_channel(qscheme):
        raise where.fail("qscheme", qscheme, "a per-tensor qscheme: a dynamic spec chooses one scale at run time")
    group_size = getattr(spec, "group_size", None)
    if is_per_channel(qscheme) or group_size is not None:
        axis = getattr(spec, "ch_axis", None)
        _check_axis(_DEFAULT_AXIS if axis is None else axis, tensor, where, "ch_axis")
    if group_size is not None:
        _check_group(group_size, tensor, where, "group_size")


def _check_range(spec: Any, dtype: torch.dtype, bounds: tuple[int, int], where: _Where) -> None:
    lo, hi = bounds
    quant_min, quant_max = spec.quant_min, spec.quant_max
    for field, value in (("quant_min", quant_min), ("quant_max", quant_max)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise where.fail(field, value, f"None or an int in [{lo}, {hi}], the range of {dtype}")
    low = lo if quant_min is None else quant_min
    high = hi if quant_max is None else quant_max
    if low > high:
        raise where.fail("quant_min", quant_min, f"quant_min <= quant_max (quant_max={high})")
    zero_point = getattr(spec, "zero_point", None)
    if isinstance(spec, FixedQParamsQuantizationSpec) and (
        isinstance(zero_point, bool) or not isinstance(zero_point, int) or not low <= zero_point <= high
    ):
        raise where.fail("zero_point", zero_point, f"an int in [quant_min, quant_max] = [{low}, {high}]")


def _check_axis(axis: Any, tensor: torch.Tensor | None, where: _Where, field: str) -> None:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise where.fail(field, axis, "an int naming a dimension of the tensor (or None: 0)")
    if tensor is None:
        return
    ndim = tensor.dim()
    if ndim == 0:
        raise where.fail(field, axis, "a per-tensor qscheme: the tensor is 0-d, it has no channel dimension")
    if not -ndim <= axis < ndim:
        raise where.fail(field, axis, f"{-ndim} to {ndim - 1}: the tensor has shape {_shape(tensor)}")


def _check_group(group_size: Any, tensor: torch.Tensor | None, where: _Where, field: str) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise where.fail(field, group_size, "an int >= 2 (or None)")
    if tensor is None:
        return
    shape = _shape(tensor)
    if len(shape) != 2:
        raise where.fail(field, group_size, f"a 2-D tensor (rows x columns) to split into groups; it has shape {shape}")
    columns = shape[1]
    if isinstance(columns, int) and columns % group_size:
        divisors = [d for d in range(2, min(columns, 1024) + 1) if columns % d == 0][-4:]
        raise where.fail(
            field, group_size, f"a divisor of the row length {columns} (the tensor has shape {shape}), e.g. {divisors}"
        )


def _inner(observer: torch.nn.Module) -> torch.nn.Module:
    if is_fake_quant_module(observer):
        inner = getattr(observer, "activation_post_process", None)
        if isinstance(inner, torch.nn.Module):
            return inner
    return observer


def check_observers(gm: GraphModule, observers: dict[EdgeOrNode, torch.nn.Module], label: Label) -> None:
    """The observers as built (a constructor's ``.with_args(ch_axis=...)`` wins over the
    spec) fit the tensors they will see: per-channel axis, group size, integer range."""
    for key, observer in observers.items():
        inner = _inner(observer)
        where = _Where(key, label, type(inner).__name__, None)
        tensor = tensor_of(gm, key)
        if is_per_channel(getattr(inner, "qscheme", None)) and isinstance(getattr(inner, "ch_axis", None), int):
            _check_axis(inner.ch_axis, tensor, where, "ch_axis")
        if getattr(inner, "group_size", None) is not None:
            _check_group(inner.group_size, tensor, where, "group_size")
        bounds = INTEGER_DTYPE_RANGES.get(integer_dtype(getattr(inner, "dtype", None)))
        quant_min, quant_max = getattr(inner, "quant_min", None), getattr(inner, "quant_max", None)
        if bounds is not None and isinstance(quant_min, int) and isinstance(quant_max, int):
            lo, hi = bounds
            for field, value in (("quant_min", quant_min), ("quant_max", quant_max)):
                if not lo <= value <= hi:
                    raise where.fail(field, value, f"an int in [{lo}, {hi}], the range of {inner.dtype}")


def check_observer_kind(
    specs: dict[EdgeOrNode, QuantizationSpecBase],
    observers: dict[EdgeOrNode, torch.nn.Module],
    is_qat: bool,
    label: Label,
    groups: Groups | None = None,
) -> None:
    """QAT needs fake-quantizers on the static, observed specs; post-training preparation
    expects observers. An error when ``prepare_qat_pt2e`` would train with no fake-quantizer
    at all; a MisuseWarning when some are missing, or when ``prepare_pt2e`` gets them.
    ``groups``: ``group_specs(specs)`` when the caller has it."""
    if not specs or (is_qat and any(getattr(spec, "per_token", False) for spec in specs.values())):
        return  # nothing observed; or per-token specs, which prepare_qat_pt2e refuses with its own error
    roots, concrete = group_specs(specs) if groups is None else groups
    static = [key for key in specs if _observes_statically(concrete[roots[key]])]
    fake = [key for key in static if is_fake_quant_module(observers.get(key))]
    plain = [key for key in static if key in observers and not is_fake_quant_module(observers[key])]
    if is_qat and plain:
        key = plain[0]
        kind = type(observers[key]).__name__
        if not fake:
            raise AnnotationError(
                f"prepare_qat_pt2e: quantizer {label(key)!r} builds plain observers, no fake-quantizer ({kind} for "
                f"{describe(key)}), so training would not simulate quantization; configure the quantizer for QAT "
                "(e.g. is_qat=True, or specs whose observer_or_fake_quant_ctr is FakeQuantize.with_args(...)), or "
                "use prepare_pt2e for post-training quantization"
            )
        warnings.warn(
            f"prepare_qat_pt2e: quantizer {label(key)!r} builds a plain observer ({kind}) for {describe(key)}"
            + (f" and {len(plain) - 1} more edge(s)/node(s)" if len(plain) > 1 else "")
            + ", not a fake-quantizer: training does not simulate quantization there",
            MisuseWarning,
            stacklevel=5,
        )
    if not is_qat and fake:
        key = fake[0]
        warnings.warn(
            f"prepare_pt2e: quantizer {label(key)!r} builds fake-quantizers ({type(observers[key]).__name__} for "
            f"{describe(key)}), which prepare_qat_pt2e uses for training: calibration will fake-quantize "
            "activations as it observes them; use prepare_qat_pt2e to train, or a post-training config "
            "(e.g. is_qat=False)",
            MisuseWarning,
            stacklevel=5,
        )


def _observes_statically(spec: QuantizationSpecBase) -> bool:
    return isinstance(spec, QuantizationSpec) and not spec.is_dynamic

"""Check a calibration batch against the inputs of the exported program, before it runs.

A prepared model runs the observers of its inputs before torch's own input guards (the
``_guards_fn`` call ``torch.export`` puts in the graph), and a wrong dtype fails only in the
first op that meets it: by then observers have recorded the batch. :class:`InputSignature`
reads what the program expects from the graph -- the ``forward`` signature, the input tree
(``_in_spec``), every placeholder's ``meta["val"]`` (rank, static sizes, symbolic sizes,
dtype) -- and :meth:`InputSignature.check` refuses a batch that does not match, naming the
input (its placeholder and position), the batch, what was expected and what was got. The
guards of the program (ranges of dynamic dimensions) run last, on the same inputs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx import GraphModule

from ..errors import CalibrationInputError

__all__ = ["InputSignature", "split_batch"]


def split_batch(batch: Any, index: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A batch as (positional, keyword) inputs: a tuple or list is positional inputs, a
    mapping keyword inputs, anything else one positional input; None is refused."""
    if batch is None:
        raise TypeError(
            f"quantweave.calibrate: batch {index} is None; expected a tensor, a tuple or list of positional "
            "inputs, or a mapping of keyword inputs (a data loader that ran out, or a collate_fn returning None?)"
        )
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    if isinstance(batch, Mapping):
        bad = [k for k in batch if not isinstance(k, str)]
        if bad:
            raise TypeError(f"quantweave.calibrate: batch {index} is a mapping with non-string keys {bad!r}")
        return (), dict(batch)
    return (batch,), {}


@dataclass(frozen=True)
class _Input:
    name: str  # placeholder name
    where: str  # "positional input 0", "keyword input 'mask'", with a path inside it
    val: Any  # meta["val"]: a FakeTensor, a SymInt, a constant, or None


def _where(path: tuple[Any, ...]) -> str:
    """'positional input 0', "keyword input 'mask'", '... [1]' for a path inside it
    (``path`` is a pytree key path into ``(args, kwargs)``)."""
    group, top, *rest = (getattr(k, "idx", getattr(k, "key", k)) for k in path)
    label = f"positional input {top}" if group == 0 else f"keyword input {top!r}"
    return label + "".join(f"[{k!r}]" for k in rest)


def _flatten(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[tuple[Any, Any]], Any]:
    leaves, spec = pytree.tree_flatten_with_path((args, kwargs))
    return leaves, spec


class InputSignature:
    """What a prepared model's ``forward`` takes, read from its graph (see module docstring)."""

    def __init__(self, model: GraphModule) -> None:
        self.model = model
        self.placeholders = [n for n in model.graph.nodes if n.op == "placeholder"]
        self.in_spec = getattr(model, "_in_spec", None)
        try:
            self.signature: inspect.Signature | None = inspect.signature(model.forward)
        except (TypeError, ValueError):  # pragma: no cover - a GraphModule's forward has one
            self.signature = None
        self.positional = 0
        self.keywords: list[str] = []
        if self.in_spec is not None and self.in_spec.num_children == 2:
            args_spec, kwargs_spec = self.in_spec.child(0), self.in_spec.child(1)
            self.positional = args_spec.num_children
            self.keywords = [str(k) for k in (kwargs_spec.context or [])]
        self.guards = _guards(model)
        #: the (shape, dtype) of the inputs of batches that passed: a batch like one of
        #: them passes too (calibration batches are mostly alike), without the checks
        self.passed: set[Any] = set()

    def describe(self) -> str:
        """The inputs as ``(x, y, *, mask)``: positional ones, then keyword ones."""
        if self.signature is None:  # pragma: no cover
            return "(?)"
        names = list(self.signature.parameters)
        if self.in_spec is None or not self.keywords:
            return "(" + ", ".join(names) + ")"
        return "(" + ", ".join([*names[: self.positional], "*", *names[self.positional :]]) + ")"

    def _bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], index: int
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The batch as the program's (positional, keyword) inputs, or an error saying
        which inputs are missing or unexpected."""
        if self.signature is None:
            return args, kwargs
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            got = f"{len(args)} positional input(s)" + (f" and keyword input(s) {sorted(kwargs)}" if kwargs else "")
            names = list(self.signature.parameters)
            unexpected = [k for k in kwargs if k not in names]
            missing = [n for n in names[len(args) :] if n not in kwargs]
            detail = "; ".join(
                part
                for part in (
                    f"unexpected keyword input(s) {unexpected}" if unexpected else "",
                    f"missing input(s) {missing}" if missing and len(args) <= len(names) else "",
                    f"{len(args) - len(names)} positional input(s) too many" if len(args) > len(names) else "",
                )
                if part
            )
            raise CalibrationInputError(
                f"quantweave.calibrate: batch {index} does not fit the exported program's inputs "
                f"{self.describe()}: {detail or exc}; got {got}"
            ) from None
        if self.in_spec is None:
            return bound.args, bound.kwargs
        values = dict(bound.arguments)
        names = list(self.signature.parameters)
        positional = tuple(values[n] for n in names[: self.positional] if n in values)
        keyword = {n: values[n] for n in names[self.positional :] if n in values}
        missing = [n for n in names if n not in values]
        if missing:  # pragma: no cover - bind refuses a batch without a required input
            raise CalibrationInputError(f"quantweave.calibrate: batch {index} lacks input(s) {missing}")
        return positional, keyword

    def _structure_difference(self, spec: Any) -> str:
        """', input 'y' (positional input 1): expected ..., got ...' for the first input
        whose structure differs from the program's."""
        names = list(self.signature.parameters) if self.signature is not None else []
        assert self.in_spec is not None
        for group in (0, 1):
            want, got = self.in_spec.child(group), spec.child(group)
            wanted = list(want.context) if group else list(range(want.num_children))
            found = list(got.context) if group else list(range(got.num_children))
            for i, key in enumerate(wanted):
                if key not in found:
                    continue
                w, g = want.child(i), got.child(found.index(key))
                if w != g:
                    name = names[i] if group == 0 and i < len(names) else key
                    where = f"positional input {i}" if group == 0 else f"keyword input {key!r}"
                    return f", input {name!r} ({where}): expected {_tree_text(w)}, got {_tree_text(g)}"
        return f": expected {_spec_text(self.in_spec)}, got {_spec_text(spec)}"

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any], index: int) -> None:
        """Raise :class:`CalibrationInputError` when batch ``index`` does not match."""
        key = _batch_key(args, kwargs)
        if key is not None and key in self.passed:
            return
        self._check(args, kwargs, index)
        if key is not None and len(self.passed) < 1024:
            self.passed.add(key)

    def _check(self, args: tuple[Any, ...], kwargs: dict[str, Any], index: int) -> None:
        positional, keyword = self._bind(args, kwargs, index)
        if self.in_spec is None:
            return
        leaves, spec = _flatten(positional, keyword)
        if spec != self.in_spec:
            raise CalibrationInputError(
                f"quantweave.calibrate: batch {index}{self._structure_difference(spec)} (the exported program's "
                f"inputs are {self.describe()})"
            )
        if len(leaves) != len(self.placeholders):  # pragma: no cover - the specs agree
            return
        symbols: dict[str, tuple[int, str]] = {}
        flat: dict[str, Any] = {}
        for (path, value), node in zip(leaves, self.placeholders, strict=True):
            item = _Input(node.name, _where(path), node.meta.get("val"))
            flat[node.name] = value
            _check_leaf(item, value, index, symbols)
        if self.guards is not None:
            guard, names = self.guards
            if all(n in flat for n in names):
                try:
                    guard(*(flat[n] for n in names))
                except AssertionError as exc:  # torch's guards assert
                    raise CalibrationInputError(
                        f"quantweave.calibrate: batch {index} fails the exported program's input constraint "
                        f"({exc}); the inputs are {self.describe()}"
                    ) from None


def _tree_text(spec: Any) -> str:
    """'a tensor' for a leaf, else the container type and its number of elements."""
    if spec.is_leaf():
        return "a tensor or a value"
    return f"{getattr(spec.type, '__name__', spec.type)} of {spec.num_children} element(s)"


def _batch_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What the checks depend on when every input is a tensor -- (shape, dtype) by
    position and keyword --, or None (another input: no shortcut)."""
    try:
        return (
            tuple((a.shape, a.dtype) for a in args),
            tuple((k, v.shape, v.dtype) for k, v in kwargs.items()),
        )
    except AttributeError:
        return None


def _spec_text(spec: Any) -> str:
    """A short description of a (args, kwargs) tree spec."""
    try:
        args_spec, kwargs_spec = spec.child(0), spec.child(1)
        return f"{args_spec.num_children} positional input(s) and keyword input(s) {list(kwargs_spec.context or [])}"
    except (AttributeError, ValueError):  # pragma: no cover
        return str(spec)


def _check_leaf(item: _Input, value: Any, index: int, symbols: dict[str, tuple[int, str]]) -> None:
    val = item.val
    if not isinstance(val, torch.Tensor):
        return  # a non-tensor input (a specialised constant or a SymInt): torch's guards check it
    head = f"quantweave.calibrate: batch {index}, input {item.name!r} ({item.where})"
    if not isinstance(value, torch.Tensor):
        raise CalibrationInputError(
            f"{head}: expected a tensor of dtype {val.dtype} and shape {_shape_text(val.shape)}; "
            f"got {type(value).__name__}"
        )
    if value.dtype != val.dtype:
        hint = ""
        if val.dtype.is_floating_point and not value.dtype.is_floating_point:
            hint = " (integer data where the program expects floating point: convert it with .float())"
        elif val.dtype.is_floating_point and value.dtype.is_floating_point:
            hint = f" (convert it with .to({val.dtype}))"
        raise CalibrationInputError(f"{head}: expected dtype {val.dtype}, got {value.dtype}{hint}")
    if value.dim() != val.dim():
        raise CalibrationInputError(
            f"{head}: expected {val.dim()} dimensions, shape {_shape_text(val.shape)}; "
            f"got {value.dim()}, shape {tuple(value.shape)}"
        )
    for dim, (want, got) in enumerate(zip(val.shape, value.shape, strict=True)):
        if isinstance(want, int):
            if want != got:
                raise CalibrationInputError(
                    f"{head}: expected size {want} in dimension {dim} (shape {_shape_text(val.shape)}, static in "
                    f"the exported program), got {got} (shape {tuple(value.shape)}); export with a dynamic "
                    "dimension (dynamic_shapes=...) to calibrate other sizes"
                )
            continue
        symbol = str(want)
        if not symbol.isidentifier():
            continue  # an expression of symbols (s0 * 2): torch's guards check it
        seen = symbols.get(symbol)
        if seen is None:
            symbols[symbol] = (int(got), f"{item.name!r} dimension {dim}")
        elif seen[0] != got:
            raise CalibrationInputError(
                f"{head}: dimension {dim} is the same dynamic size ({symbol}) as {seen[1]} in the exported program; "
                f"expected {seen[0]}, got {got} (shape {tuple(value.shape)})"
            )


def _shape_text(shape: Any) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _guards(model: GraphModule) -> tuple[Callable[..., Any], list[str]] | None:
    """torch.export's input guards (a ``call_module`` of ``_guards_fn`` on the placeholders)
    and the names of the placeholders it takes, or None."""
    for node in model.graph.find_nodes(op="call_module", target="_guards_fn"):
        names = [a.name for a in node.args if isinstance(a, torch.fx.Node)]
        if len(names) != len(node.args):
            return None
        try:
            guard = model.get_submodule("_guards_fn")
        except AttributeError:
            return None
        return guard, names
    return None

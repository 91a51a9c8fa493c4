"""``calibrate(prepared, batches)``: run calibration data through a prepared model.

Runs every batch under ``torch.no_grad()`` and says how far it is:

- ``progress=None`` (default): a progress bar on standard error when it is a terminal and
  the number of batches is known (``len(batches)`` or ``total=``); silent otherwise (logs,
  CI, pipes);
- ``progress=True`` / ``False``: the bar always (when the count is unknown it counts
  without a total) / never;
- ``progress=callable``: called as ``callback(batches_done, total_or_None)`` after each
  batch, for notebooks and loggers (no bar is drawn).

The bar is `tqdm <https://tqdm.github.io>`_: pure Python, no dependencies of its own on
Linux and macOS, about 80 kB, imported only when a bar is drawn. It is a dependency of the
core (an optional extra would leave the users who install only ``quantweave`` with the
silent calibration this exists to end); if it is missing (installed with ``--no-deps``)
calibration runs silently.

Returns a :class:`CalibrationResult`: batches run, observers that saw data, and the
observers that need data and saw none (``convert_pt2e`` would raise
:class:`~quantweave.ObserverNotCalibratedError` naming them).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule

from ._modules.batch_guard import BatchGuard
from ._modules.calibration_checks import warn_no_batches, weight_observers
from ._modules.observer_calls import observer_calls
from .observers import (
    DerivedObserver,
    FakeQuantizeBase,
    FixedQParamsObserver,
    ObserverBase,
    PlaceholderObserver,
    is_calibrated,
    is_fake_quant_module,
)

__all__ = ["CalibrationResult", "ProgressCallback", "calibrate"]

ProgressCallback = Callable[[int, int | None], None]


@dataclass(frozen=True)
class CalibrationResult:
    """What calibration did: ``batches`` run (and kept); ``observers``: the distinct observer (or
    fake-quantize) modules that learn from data (fixed-qparams, dynamic placeholder and
    derived observers need none and are not counted); ``observed``: those that saw data;
    ``not_observed``: the names of those that saw none (weight observers see their
    weight on every call, so these are activations no batch reached)."""

    batches: int
    observers: int
    observed: int
    not_observed: tuple[str, ...] = ()
    #: indices of the batches skipped for non-finite values (``non_finite="skip"``)
    skipped: tuple[int, ...] = ()

    def __str__(self) -> str:
        missing = f"; no data reached {', '.join(self.not_observed)}" if self.not_observed else ""
        skipped = f"; {len(self.skipped)} skipped (non-finite values)" if self.skipped else ""
        return f"{self.batches} batches, {self.observed} of {self.observers} observers saw data{missing}{skipped}"


def _learns_from_data(module: torch.nn.Module) -> bool:
    if is_fake_quant_module(module):
        inner = getattr(module, "activation_post_process", None)
        return isinstance(inner, torch.nn.Module) and _learns_from_data(inner)
    if isinstance(module, (FixedQParamsObserver, PlaceholderObserver, DerivedObserver)):
        return False
    # torch's observers learn unless listed above; others (torchao's) when they keep min_val
    if isinstance(module, (ObserverBase, FakeQuantizeBase)):
        return True
    return isinstance(getattr(module, "min_val", None), torch.Tensor)


def _observers(model: GraphModule) -> dict[str, torch.nn.Module]:
    """The observers ``model``'s graph calls, and those of the subgraphs it runs (``scan`` /
    ``while_loop`` bodies, which prepare quantizes too), by qualified name."""
    found: dict[str, torch.nn.Module] = {}
    for prefix, gm in model.named_modules():
        if not isinstance(gm, GraphModule):
            continue
        for node, module in observer_calls(gm):
            found[f"{prefix}.{node.target}" if prefix else str(node.target)] = module
    return found


def _saw_data(module: torch.nn.Module) -> bool:
    if is_fake_quant_module(module):
        inner = getattr(module, "activation_post_process", None)
        return isinstance(inner, torch.nn.Module) and _saw_data(inner)
    return is_calibrated(module) and _has_statistics(module)


def _has_statistics(module: torch.nn.Module) -> bool:
    min_val = getattr(module, "min_val", None)
    return isinstance(min_val, torch.Tensor) and min_val.numel() > 0


def _tqdm(total: int | None) -> Any:
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:  # installed without its dependencies: calibrate silently
        return None
    return tqdm(total=total, desc="calibrating", unit="batch", file=sys.stderr, leave=True, disable=False)


def calibrate(
    prepared: GraphModule,
    batches: Iterable[Any],
    *,
    progress: bool | ProgressCallback | None = None,
    total: int | None = None,
    non_finite: str = "error",
) -> CalibrationResult:
    """Run ``batches`` through ``prepared`` (from ``prepare_pt2e``) under ``torch.no_grad()``.

    A batch is a tuple or list of positional inputs, a mapping of keyword inputs, or a
    single input. ``total``: the number of batches, when ``batches`` has no ``len``.
    ``progress``: see the module docstring (bar on a terminal, never, always, or a
    ``callback(batches_done, total_or_None)``).

    Each batch updates every observer or none (see the module docstring): a batch that
    does not match the exported program's inputs raises
    :class:`~quantweave.errors.CalibrationInputError` before it runs; one whose forward
    fails leaves the observers as they were before it, and the exception gets a note naming
    the batch (and the observer it failed in). ``non_finite``: what to do with a batch that
    brings NaN or infinite values to an observer -- ``"error"`` (default):
    :class:`~quantweave.errors.NonFiniteDataError` naming the observer, its node and the
    batch; ``"skip"``: the batch is rolled back and skipped, with a warning, and counted in
    :attr:`CalibrationResult.skipped`.
    """
    if not isinstance(prepared, GraphModule):
        raise TypeError(f"calibrate expects the GraphModule returned by prepare_pt2e; got {type(prepared).__name__}")
    if progress is not None and not isinstance(progress, bool) and not callable(progress):
        raise TypeError(f"calibrate: progress must be None, a bool or a callable; got {progress!r}")
    if non_finite not in _NON_FINITE_POLICIES:
        raise ValueError(f"calibrate: non_finite must be one of {list(_NON_FINITE_POLICIES)}; got {non_finite!r}")
    if batches is None or isinstance(batches, (torch.Tensor, str, bytes)) or not isinstance(batches, Iterable):
        raise TypeError(_not_batches(batches))
    if total is None:
        try:
            total = len(batches)  # type: ignore[arg-type]
        except TypeError:
            total = None
    callback = progress if callable(progress) and not isinstance(progress, bool) else None
    if progress is None:
        show = total is not None and sys.stderr is not None and sys.stderr.isatty()
    else:
        show = progress is True
    observers = _observers(prepared)
    guard = BatchGuard(prepared, observers, non_finite == "skip")
    bar = _tqdm(total) if show and callback is None else None
    done = 0
    try:
        with torch.no_grad():
            for index, batch in enumerate(batches):
                if guard.run(batch, index):
                    done += 1
                if bar is not None:
                    bar.update(1)
                if callback is not None:
                    callback(index + 1, total)
    finally:
        if bar is not None:
            bar.close()
    learning = {name: m for name, m in observers.items() if _learns_from_data(m)}
    observed = sum(1 for m in learning.values() if _saw_data(m))
    weights = weight_observers(prepared)  # they observe their constant at convert time: never "missing"
    missing = tuple(name for name, m in learning.items() if not _saw_data(m) and name not in weights)
    if done == 0 and not guard.skipped:
        warn_no_batches(missing)
    return CalibrationResult(done, len(learning), observed, missing, skipped=tuple(guard.skipped))


_NON_FINITE_POLICIES = ("error", "skip")


def _not_batches(batches: Any) -> str:
    what = "None" if batches is None else type(batches).__name__
    if isinstance(batches, torch.Tensor):
        hint = "wrap one batch in a list: calibrate(prepared, [batch]) (a tensor would be iterated row by row)"
    else:
        hint = "pass a list of batches, a DataLoader or another iterable of batches"
    return f"quantweave.calibrate: batches must be an iterable of batches; got {what}: {hint}"

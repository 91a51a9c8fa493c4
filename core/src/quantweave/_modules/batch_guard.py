"""One calibration batch as a transaction: it updates every observer or none.

:class:`BatchGuard` is what ``quantweave.calibrate`` runs each batch through:

1. the batch is split into inputs (``None`` refused) and checked against the exported
   program's inputs (:class:`~quantweave._modules.batch_inputs.InputSignature`): a mismatch
   raises :class:`~quantweave.errors.CalibrationInputError` before anything runs;
2. the forward runs; if it raises, every observer is restored
   (:class:`~quantweave._modules.observer_state.ObserverStates`) and the exception
   propagates with a note naming the batch (and the observer it failed in, when it failed
   in one);
3. if NaN or infinite values reached an observer, the batch is rolled back too, and either
   :class:`~quantweave.errors.NonFiniteDataError` names the observer, its node and the
   batch, or (``skip``) a warning says so and the batch is counted as skipped.
"""

from __future__ import annotations

import warnings
from types import TracebackType
from typing import Any

import torch
from torch.fx import GraphModule

from ..errors import NonFiniteDataError
from .batch_inputs import InputSignature, split_batch
from .observer_state import ObserverStates

__all__ = ["BatchGuard"]


def observed_nodes(model: GraphModule) -> dict[str, list[str]]:
    """Observer module name -> the names of the nodes it observes (in graph order)."""
    found: dict[str, list[str]] = {}
    for node in model.graph.nodes:
        if node.op == "call_module" and node.args and isinstance(node.args[0], torch.fx.Node):
            found.setdefault(str(node.target), []).append(node.args[0].name)
    return found


class BatchGuard:
    """See the module docstring. ``observers``: name -> observer module of ``model``."""

    def __init__(self, model: GraphModule, observers: dict[str, torch.nn.Module], skip_non_finite: bool) -> None:
        self.model = model
        self.signature = InputSignature(model)
        self.states = ObserverStates(observers)
        self.nodes = observed_nodes(model)
        self.skip_non_finite = skip_non_finite
        self.skipped: list[int] = []
        self.ids = {id(m): name for name, m in observers.items()}
        for name, observer in observers.items():
            for sub in observer.modules():
                self.ids.setdefault(id(sub), name)

    def run(self, batch: Any, index: int) -> bool:
        """Run batch ``index``; True when it was kept, False when skipped (non-finite)."""
        args, kwargs = split_batch(batch, index)
        self.signature.check(args, kwargs, index)
        states = self.states
        states.begin()
        try:
            self.model(*args, **kwargs)
        except BaseException as exc:
            bad = states.non_finite()
            states.restore()
            if bad and isinstance(exc, Exception):
                if self._skip(bad, index):
                    return False
                raise self._non_finite_error(bad, index) from exc
            exc.add_note(self._failure_note(exc.__traceback__, index))
            raise
        bad, packed = states.check(states.changed_slots())
        if bad:
            states.restore()
            if self._skip(bad, index):
                return False
            raise self._non_finite_error(bad, index)
        states.commit(packed)
        return True

    def _describe(self, owner: str) -> str:
        observer = self.ids.get(id(self.model.get_submodule(owner)), owner) if owner else owner
        nodes = self.nodes.get(observer, [])
        kind = type(self.model.get_submodule(observer)).__name__
        observes = f"observes node {', '.join(map(repr, nodes))}" if nodes else "observes no node"
        return f"observer {observer!r} (a {kind}; {observes})"

    def _skip(self, bad: list[str], index: int) -> bool:
        if not self.skip_non_finite:
            return False
        self.skipped.append(index)
        warnings.warn(
            f"quantweave.calibrate: skipped batch {index}: NaN or infinite values reached "
            f"{self._describe(bad[0])}; no observer kept any of it (non_finite='skip')",
            RuntimeWarning,
            stacklevel=4,
        )
        return True

    def _non_finite_error(self, bad: list[str], index: int) -> NonFiniteDataError:
        others = f" (and {len(bad) - 1} more observer(s))" if len(bad) > 1 else ""
        return NonFiniteDataError(
            f"quantweave.calibrate: batch {index}: NaN or infinite values reached {self._describe(bad[0])}{others}. "
            "The batch was rolled back: no observer kept any of it. Clean the data (torch.nan_to_num, or drop "
            "the batch), or pass non_finite='skip' to skip such batches with a warning"
        )

    def _failure_note(self, tb: TracebackType | None, index: int) -> str:
        where = ""
        while tb is not None:  # the innermost observer the exception passed through
            module = tb.tb_frame.f_locals.get("self")
            if isinstance(module, torch.nn.Module) and id(module) in self.ids:
                where = f" in {self._describe(self.ids[id(module)])}"
            tb = tb.tb_next
        return (
            f"quantweave.calibrate: batch {index} failed{where}; every observer was restored to its state "
            "before this batch"
        )

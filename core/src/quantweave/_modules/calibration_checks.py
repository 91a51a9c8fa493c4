"""What ``calibrate`` says about observers no batch reached.

* :func:`weight_observers` -- the observers of constants (weights and what is computed from
  them only): they see their value on every call and ``convert_pt2e`` observes the constant
  itself, so they never need calibration data and are not "missing" when no batch ran;
* :func:`warn_no_batches` -- ``calibrate`` given no batch at all (an empty list, an exhausted
  iterator) while activation observers need data (MisuseWarning naming them).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from torch.fx import GraphModule, Node

from ..errors import MisuseWarning
from .graph import is_constant
from .observer_calls import observer_calls

__all__ = ["warn_no_batches", "weight_observers"]


def weight_observers(model: GraphModule) -> set[str]:
    """Qualified names of the observers (in ``model`` and its subgraphs) whose input is a constant."""
    found: set[str] = set()
    for prefix, gm in model.named_modules():
        if not isinstance(gm, GraphModule):
            continue
        cache: dict[Node, bool] = {}
        for node, _ in observer_calls(gm):
            if node.args and isinstance(node.args[0], Node) and is_constant(node.args[0], cache):
                found.add(f"{prefix}.{node.target}" if prefix else str(node.target))
    return found


def warn_no_batches(missing: Sequence[str]) -> None:
    """``calibrate`` ran no batch: warn when activation observers (``missing``) need data."""
    if not missing:
        return
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    warnings.warn(
        f"quantweave.calibrate: got no batches (an empty list, or an iterator that was already used up?), so "
        f"{len(missing)} activation observer(s) saw no data ({shown}) and convert_pt2e would raise "
        "ObserverNotCalibratedError; pass a list of batches, or a DataLoader, with at least one batch",
        MisuseWarning,
        stacklevel=3,
    )

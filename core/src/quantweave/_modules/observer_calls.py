"""Which nodes of a prepared graph call an observer (or fake-quantize) module: the one answer
calibration, convert, the misuse checks and distributed calibration share."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx import GraphModule, Node

from ..observers import is_observer_module

__all__ = ["observer_calls"]


def observer_calls(
    gm: GraphModule, accept: Callable[[torch.nn.Module], bool] = is_observer_module
) -> list[tuple[Node, torch.nn.Module]]:
    """``(node, module)`` for each ``call_module`` node of ``gm``'s own graph (not its
    subgraphs) whose module ``accept`` takes (default: an observer or fake-quantizer, ours or
    torchao's), in graph order; a target naming no submodule is passed over."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        try:
            module = gm.get_submodule(str(node.target))
        except AttributeError:
            continue
        if accept(module):
            found.append((node, module))
    return found

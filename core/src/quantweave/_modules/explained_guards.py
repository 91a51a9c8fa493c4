"""torch.export's input guards, explained: a batch of another size than the exported one.

``torch.export.export(...).module()`` calls a ``_guards_fn`` submodule on its inputs that
asserts the static sizes of the export (``Guard failed: x.size()[0] == 2``). On the models
prepare returns (and so convert, which keeps the submodule), :func:`explain_guards` wraps it
in :class:`ExplainedGuards`: the same checks, and when one fails an ``AssertionError`` (the
class torch raises) naming the input, the shape exported and the shape got, and how to export
with a dynamic batch dimension. While torch compiles or exports the model the wrapper calls
the guards as they are, so what torch traces is unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node

__all__ = ["ExplainedGuards", "explain_guards"]

GUARDS = "_guards_fn"


class ExplainedGuards(torch.nn.Module):
    """``guards`` (torch's ``_guards_fn``) whose failure names the input and the fix."""

    def __init__(self, guards: torch.nn.Module, inputs: list[tuple[str, tuple[int | None, ...] | None]]) -> None:
        super().__init__()
        self.guards = guards
        #: (placeholder name, exported shape: an int per static dimension, None per dynamic one)
        self.inputs = inputs
        self._is_impure = True  # a call without users: never removed as dead code

    def forward(self, *args: Any) -> Any:
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return self.guards(*args)
        try:
            return self.guards(*args)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.explain(args)}") from None

    def explain(self, args: tuple[Any, ...]) -> str:
        for (name, shape), value in zip(self.inputs, args, strict=False):
            if shape is None or not isinstance(value, torch.Tensor):
                continue
            got = tuple(value.shape)
            if len(got) != len(shape):
                return (
                    f"input {name!r} has {len(got)} dimensions, shape {got}; the program was exported with "
                    f"{len(shape)}, shape {_text(shape)}"
                )
            for dim, (want, size) in enumerate(zip(shape, got, strict=True)):
                if want is not None and want != size:
                    which = "the batch dimension (0)" if dim == 0 else f"dimension {dim}"
                    return (
                        f"input {name!r} has shape {got}, the program was exported with shape {_text(shape)}: "
                        f"{which} is static. To run other sizes, export with it dynamic: "
                        f"torch.export.export(model, args, dynamic_shapes={{{name!r}: {{{dim}: "
                        "torch.export.Dim.AUTO}}).module() (keys are the forward's argument names), then prepare "
                        "that"
                    )
        return "an input does not meet a constraint of the exported program (see the guard above)"


def _text(shape: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("?" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _shape(node: Node) -> tuple[int | None, ...] | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    return tuple(s if isinstance(s, int) else None for s in val.shape)


def explain_guards(model: GraphModule) -> GraphModule:
    """Wrap ``model``'s ``_guards_fn`` (if any, and not wrapped yet) in :class:`ExplainedGuards`;
    sets an attribute of ``model`` only (a module prepare made), never of the caller's."""
    guards = getattr(model, GUARDS, None)
    if not isinstance(guards, torch.nn.Module) or isinstance(guards, ExplainedGuards):
        return model
    for node in model.graph.find_nodes(op="call_module", target=GUARDS):
        inputs = [(a.name, _shape(a)) if isinstance(a, Node) else ("?", None) for a in node.args]
        setattr(model, GUARDS, ExplainedGuards(guards, inputs))
        break
    return model

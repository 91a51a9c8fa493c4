"""Save and load a converted model in one call.

A ``convert_pt2e`` result is a ``torch.fx.GraphModule`` produced from ``torch.export``'s
module: ``torch.export.save`` wants an ``ExportedProgram`` and ``torch.save`` cannot pickle
it (it raises a TypeError that points here). :func:`save` re-exports it
(``torch.export.export(converted, example_inputs)``) and writes the standard ``.pt2``
archive of ``torch.export.save``; :func:`load` reads it back
(``torch.export.load(path).module()``). The folded int8 weights stay int8 in the file (a
converted model's file is about a quarter of the float one's), and the loaded model's
outputs are bit-identical to the saved model's on the same inputs. Each weight is written
straight from its tensor's memory, one after another: saving holds no copy of the weights.

The file is an ordinary ``torch.export`` program: ``torch.export.load(path)`` returns the
``ExportedProgram`` too (``quantweave.json`` in its extra files records the quantweave
version that saved it).

Errors name the file and say what it is: :func:`load` raises ``FileNotFoundError`` for a
missing file and :class:`~quantweave.SerializationError` for a directory, an empty file,
a file that is not a zip archive, a truncated archive, a ``torch.save`` file (a state dict)
rather than a program, a program written by a newer quantweave, or one torch cannot read.
:func:`save` writes to a temporary file beside the target and renames it into place, so a
failed save leaves the target as it was (no half-written file).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule

from ._modules.archive import META, atomic_target, check_loadable
from ._modules.archive_stream import streamed_weights
from ._modules.observer_calls import observer_calls
from .errors import SerializationError

__all__ = ["load", "save"]


def _check_converted(model: GraphModule) -> None:
    found = observer_calls(model)
    if found:
        node, module = found[0]
        raise SerializationError(
            f"quantweave.save: the model still has observers (node {node.name!r}, a {type(module).__name__}): it is "
            "prepared, not converted. Calibrate it, then save quantweave.convert_pt2e(prepared)."
        )


def save(
    model: GraphModule | torch.export.ExportedProgram,
    example_inputs: Sequence[Any] | torch.Tensor,
    path: str | os.PathLike[str],
    *,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | list[Any] | None = None,
) -> Path:
    """Save a converted model (``quantweave.convert_pt2e``'s result) to ``path`` (``.pt2``).

    ``example_inputs``: inputs of the shapes the model was exported with (a tensor or a
    tuple), used to re-export it; ``dynamic_shapes`` is passed to ``torch.export.export``.
    An ``ExportedProgram`` is saved as is. Returns the path.

    Raises :class:`~quantweave.SerializationError` for a prepared model that was not
    converted (it names the first observer) and for anything that is not a GraphModule
    or an ExportedProgram.
    """
    from ._modules.version import __version__

    if isinstance(model, torch.export.ExportedProgram):
        program = model
    elif isinstance(model, GraphModule):
        _check_converted(model)
        args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
        try:
            program = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
        except Exception as exc:
            exc.add_note(f"quantweave.save: re-exporting the model for {str(path)!r} failed; nothing was written")
            raise
    else:
        raise SerializationError(
            "quantweave.save expects the GraphModule returned by quantweave.convert_pt2e (or an ExportedProgram); "
            f"got {type(model).__name__}"
        )
    target = Path(path)
    meta = json.dumps({"quantweave": __version__, "format": "torch.export"})
    try:
        # the target is replaced only by a complete file; each weight is written from its storage
        with atomic_target(target) as temporary, streamed_weights():
            torch.export.save(program, temporary, extra_files={META: meta})
    except OSError as exc:
        exc.add_note(f"quantweave.save: writing {str(target)!r} failed; the file (if any) is as it was")
        raise
    return target


def load(path: str | os.PathLike[str]) -> GraphModule:
    """Load a model written by :func:`save` (or any ``torch.export.save`` file) as a
    runnable ``GraphModule``, ready to call or to lower (``quantweave_x86.lower``).

    Raises ``FileNotFoundError`` for a missing file and
    :class:`~quantweave.SerializationError` naming the file and what it is otherwise (see
    the module docstring); the file is only read."""
    from ._modules.version import __version__

    source = Path(path)
    check_loadable(source, __version__)
    try:
        module = torch.export.load(source).module()
    except Exception as exc:  # torch's own messages name neither the file nor what to do
        raise SerializationError(
            f"quantweave.load: {str(source)!r} is a .pt2 archive torch.export.load cannot read "
            f"({type(exc).__name__}: {exc}); it may be corrupt, or written by another torch version "
            f"(this is torch {torch.__version__}): save it again with this one"
        ) from exc
    if not isinstance(module, GraphModule):  # pragma: no cover - torch.export returns a GraphModule
        raise SerializationError(f"quantweave.load: {path} did not load as a GraphModule")
    return module

"""The modules ``prepare_pt2e`` / ``convert_pt2e`` return refuse pickling with a TypeError that
says what to use instead.

``torch.export``'s modules cannot be pickled, and neither can a model prepared or converted from
one. Without this mixin, ``torch.save(model)`` (and ``pickle``, and ``multiprocessing`` handing
the model to another process) failed deep in the object graph:
- a converted model with ``RecursionError``: its ``train`` / ``eval`` are bound to the model itself,
  a cycle that pickle's reduce protocol follows;
- a prepared one with ``cannot pickle 'weakref.ReferenceType' object``.
Neither error names the model or a way out. :class:`RefusesPickling` is mixed into the classes of
the returned modules (``torch_compat.deferred_graph_module``), so the refusal reaches their deep
copies too. ``copy.deepcopy`` and ``copy.copy`` do not pickle, and keep working.
"""

from __future__ import annotations

from typing import NoReturn, SupportsIndex

__all__ = ["PICKLING_MESSAGE", "RefusesPickling"]

PICKLING_MESSAGE = (
    "cannot pickle a model returned by quantweave.prepare_pt2e / prepare_qat_pt2e / convert_pt2e "
    "(pickle, torch.save(model) and multiprocessing pickle what they are given; torch.export's "
    "modules, which these come from, cannot be pickled either): save a converted model with "
    "quantweave.save(model, example_inputs, path) and read it back with quantweave.load(path); "
    "calibrate a prepared model and convert it (quantweave.convert_pt2e) first"
)


class RefusesPickling:
    """Pickling an instance raises ``TypeError(PICKLING_MESSAGE)`` at once."""

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise TypeError(PICKLING_MESSAGE)

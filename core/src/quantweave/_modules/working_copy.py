"""The working copy ``prepare_pt2e`` hands to ``transform_for_annotation``.

Prepare copies the caller's graph (``copy_graph_module``) and runs the quantizer's hooks on
that copy, which nothing else holds: a rewrite before annotation may edit it in place rather
than copy it again (a copy, its Python code and its compile were a visible part of preparing
an LLM, issue 25). Prepare registers its copy for the duration of ``transform_for_annotation``
(:func:`handed_over`); ``quantweave.authoring.copy_for_rewrite(model, reuse_working_copy=True)``
returns it as is, and ``finish_rewrite`` leaves its code to be generated once, by prepare's
own rebuild. Any other module (the caller's, a copy of the working copy) is copied as before.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch

__all__ = ["handed_over", "is_working_copy"]

_WORKING: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


@contextlib.contextmanager
def handed_over(model: torch.nn.Module) -> Iterator[None]:
    """``model`` is prepare's own working copy while the block runs."""
    _WORKING.add(model)
    try:
        yield
    finally:
        _WORKING.discard(model)


def is_working_copy(model: torch.nn.Module) -> bool:
    return model in _WORKING

"""Python's cyclic garbage collector held off while prepare / convert build graphs.

Building a graph creates thousands of container objects (nodes, their meta dicts, argument
tuples, modules and their dicts), most of which the caller keeps: the collector's young
generations are collected every few hundred of them, and each collection walks objects that
are all still alive (issue 25: ~1 ms of an 8da4w prepare + convert of ~20 ms, and now and then
a full collection of the caller's whole heap landing inside the call). Reference counting
still frees everything acyclic at once; what the collector would have found (a few dozen
objects of cyclic garbage per call) waits until the caller's next allocations.

:func:`pausing_collections` wraps the public entry points: the collector is disabled for the
call and enabled again when it returns or raises, only if it was enabled when the call
started (a caller that disabled it keeps it disabled; a nested call changes nothing).
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import TypeVar

__all__ = ["pausing_collections"]

_F = TypeVar("_F", bound=Callable[..., object])


def pausing_collections(function: _F) -> _F:
    """``function`` with the cyclic garbage collector disabled while it runs (see the module
    docstring); the collector's state is the caller's again when it returns or raises."""

    @functools.wraps(function)
    def paused(*args: object, **kwargs: object) -> object:
        if not gc.isenabled():  # the caller's choice (or an enclosing call's): left as it is
            return function(*args, **kwargs)
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            gc.enable()

    return paused  # type: ignore[return-value]

"""Tensor work (observing and quantizing weights) on a second thread while convert rewrites the graph.

Convert has two kinds of work: the graph rewrite (Python: nodes, buffers, names; it holds
the GIL) and the per-weight tensor work (observers' min/max of the constants, quantizing
them: torch ops, which release the GIL while they run). With more than one intra-op thread
(``torch.get_num_threads() > 1``) :class:`TensorWork` runs the tensor work on one worker
thread, in the order it was submitted, while the caller's thread goes on with the graph;
with one thread it runs each task at once in the caller's thread, in the same order as
before (nothing is started, nothing gets slower).

- The same functions run on the same values in the same order (one worker, first in first
  out), so every result is the one computed in the caller's thread; the worker runs them
  under ``torch.no_grad()`` (grad mode is per thread).
- An exception a task raises is kept and raised in the caller's thread by
  :meth:`Handle.result` (the same exception object: type, message and the names in it).
- :meth:`TensorWork.close` (the ``with`` block's end) cancels what has not started and
  joins the worker: no thread outlives the convert that started it, error or not.
- One worker, not one per intra-op thread: the worker's ops use torch's intra-op threads as
  any op does, and the caller's thread meanwhile runs Python, so two workers would run more
  threads than torch was told to use.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any

import torch

__all__ = ["Handle", "TensorWork"]


class Handle:
    """The result of one submitted task: :meth:`result` waits for it, then returns it or
    raises the task's exception (in the caller's thread)."""

    __slots__ = ("_error", "_future", "_value")

    def __init__(self, future: Future[Any] | None = None, value: Any = None, error: BaseException | None = None):
        self._future, self._value, self._error = future, value, error

    def result(self) -> Any:
        if self._future is not None:
            return self._future.result()
        if self._error is not None:
            raise self._error
        return self._value


def _no_grad_call(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    with torch.no_grad():
        return fn(*args)


class TensorWork:
    """Runs submitted tensor work on one worker thread when torch uses more than one
    intra-op thread (``threads``, default ``torch.get_num_threads()``), else at once."""

    def __init__(self, threads: int | None = None) -> None:
        threads = torch.get_num_threads() if threads is None else threads
        self.concurrent = threads > 1
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantweave-convert") if self.concurrent else None
        )

    def submit(self, fn: Callable[..., Any], *args: Any) -> Handle:
        if self._pool is None:
            try:
                with torch.no_grad():
                    return Handle(value=fn(*args))
            except Exception as exc:  # raised by result(), where a worker's would be
                return Handle(error=exc)
        return Handle(self._pool.submit(_no_grad_call, fn, args))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> TensorWork:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

"""Tensor work (observing and quantizing weights) on worker threads while convert rewrites the graph.

Convert has two kinds of work: the graph rewrite (Python: nodes, buffers, names; it holds
the GIL) and the per-weight tensor work (observers' min/max of the constants, quantizing
them: torch ops, which release the GIL while they run). With ``torch.get_num_threads() > 1``
:class:`TensorWork` runs the tensor work on one worker thread, in the order submitted, its
ops on torch's intra-op threads as any op's, while the caller's thread goes on with the
graph and then waits. With one thread each task runs at once in the caller's thread, in the
order submitted (as before: nothing is started, nothing gets slower); so do they when the
caller's thread has a torch dispatch / function mode, inference mode or autocast on, which a
worker thread would not see.

Measured at load 8 on 2 cores (8da4w convert, CPU per convert, 2 threads): this 70-78 ms;
``n`` workers each on one intra-op thread (OpenMP's per-thread setting) 300-320 ms, the
caller's idle OpenMP thread spinning; everything in the caller's thread (before) 1950-2020 ms.

- The same functions run on the same values, in the same order, so every result is the one
  computed in the caller's thread alone (:class:`PerThread` gives any thread running tasks
  its own scratch buffer); tasks run under ``torch.no_grad()`` (grad mode is per thread).
- An exception a task raises is kept and raised in the caller's thread by
  :meth:`Handle.result` (the same exception object: type, message and the names in it).
- :meth:`TensorWork.close` (the ``with`` block's end) drops what has not started and joins
  the worker: no thread outlives the convert that started it, error or not.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch

__all__ = ["Handle", "PerThread", "TensorWork"]


def _thread_local_modes() -> bool:
    """True when the caller's thread has state a worker thread would not see: a torch
    dispatch or function mode (``FakeTensorMode``, a ``TorchDispatchMode``...), inference
    mode or autocast (then the tasks run in the caller's thread, as with one thread)."""
    count_dispatch = getattr(torch._C, "_len_torch_dispatch_stack", None)
    count_function = getattr(torch._C, "_len_torch_function_stack", None)
    if count_dispatch is None or count_function is None:  # pragma: no cover - another torch
        return True
    return bool(
        count_dispatch() or count_function() or torch.is_inference_mode_enabled() or torch.is_autocast_enabled("cpu")
    )


class Handle:
    """The result of one submitted task: :meth:`result` waits for it, then returns it or
    raises the task's exception in the caller's thread."""

    __slots__ = ("_args", "_done", "_error", "_fn", "_started", "_value", "_work")

    def __init__(self, work: TensorWork | None, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._work, self._fn, self._args = work, fn, args
        self._started = self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            with torch.no_grad():
                self._value = self._fn(*self._args)
        except BaseException as exc:  # raised by result(), in the caller's thread
            self._error = exc
        self._fn, self._args = None, ()  # type: ignore[assignment]
        self._done = True

    def result(self) -> Any:
        if not self._done and self._work is not None:
            self._work._wait(self)
        if self._error is not None:
            raise self._error
        return self._value


class PerThread:
    """One object per thread that asks (``get``), made by ``factory``: scratch buffers
    tasks running at the same time must not share."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._objects: dict[int, Any] = {}

    def get(self) -> Any:
        key = threading.get_ident()
        found = self._objects.get(key)
        if found is None:
            found = self._objects.setdefault(key, self._factory())
        return found


class TensorWork:
    """Runs submitted tensor work on one worker thread when torch uses more than one
    intra-op thread (``threads``, default ``torch.get_num_threads()``), else at once."""

    def __init__(self, threads: int | None = None) -> None:
        threads = torch.get_num_threads() if threads is None else threads
        self.concurrent = threads > 1 and not _thread_local_modes()
        self._queue: deque[Handle] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self._workers = [
            threading.Thread(target=self._serve, name=f"quantweave-convert-{i}", daemon=True)
            for i in range(1 if self.concurrent else 0)
        ]
        for worker in self._workers:
            worker.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Handle:
        if not self.concurrent:
            handle = Handle(None, fn, args)
            handle._run()
            return handle
        handle = Handle(self, fn, args)
        with self._changed:
            self._queue.append(handle)
            self._changed.notify_all()
        return handle

    def _finish(self, handle: Handle) -> None:
        handle._run()
        with self._changed:
            self._changed.notify_all()

    def _serve(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._closed:
                    self._changed.wait()
                if not self._queue:
                    return
                handle = self._queue.popleft()
                handle._started = True
            self._finish(handle)

    def _wait(self, handle: Handle) -> None:
        """Until ``handle`` is done."""
        with self._changed:
            while not handle._done:
                if self._closed and not handle._started:
                    raise RuntimeError("quantweave: a task was dropped before it ran (its TensorWork was closed)")
                self._changed.wait()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._queue.clear()
            self._changed.notify_all()
        for worker in self._workers:
            worker.join()
        self._workers = []

    def __enter__(self) -> TensorWork:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

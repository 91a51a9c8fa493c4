"""Tensor work (observing and quantizing weights) on worker threads while convert rewrites the graph.

Convert has two kinds of work: the graph rewrite (Python: nodes, buffers, names; it holds
the GIL) and the per-weight tensor work (observers' min/max of the constants, quantizing
them: torch ops, which release the GIL while they run). With ``n = torch.get_num_threads()
> 1`` intra-op threads, :class:`TensorWork` runs the tensor work on ``n - 1`` worker
threads while the caller's thread goes on with the graph; a caller waiting for a result
(:meth:`Handle.result`) runs queued tasks itself meanwhile. Every thread running tasks runs
its ops on one intra-op thread (OpenMP's per-thread setting, restored in the caller's
thread after each task), so no more than ``n`` threads compute at once: the ``n`` threads
torch was told to use, working on ``n`` weights (or on the graph) at a time instead of
splitting each op. With one thread, or where torch's intra-op threads are not OpenMP's,
each task runs at once in the caller's thread, in the order submitted (as before: nothing
is started, nothing gets slower).

- The same functions run on the same values, so every result is the one computed in the
  caller's thread alone (tasks share nothing they write: ``per_thread`` gives each thread
  its own scratch buffers); tasks run under ``torch.no_grad()`` (grad mode is per thread).
- An exception a task raises is kept and raised in the caller's thread by
  :meth:`Handle.result` (the same exception object: type, message and the names in it).
- :meth:`TensorWork.close` (the ``with`` block's end) drops what has not started and joins
  the workers: no thread outlives the convert that started it, error or not.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch

__all__ = ["Handle", "PerThread", "TensorWork"]


def _openmp() -> Any:
    """The process's OpenMP runtime (``omp_set_num_threads`` / ``omp_get_max_threads``,
    which act on the calling thread) when torch's intra-op threads are OpenMP's, else None."""
    if "OpenMP" not in torch.__config__.parallel_info().split("parallel backend:", 1)[-1].split("\n", 1)[0]:
        return None  # pragma: no cover - a torch built with native / TBB threads
    try:
        library = ctypes.CDLL(None)
        set_threads, get_threads = library.omp_set_num_threads, library.omp_get_max_threads
    except (AttributeError, OSError):  # pragma: no cover - symbols not visible
        return None
    set_threads.argtypes, set_threads.restype = [ctypes.c_int], None
    get_threads.argtypes, get_threads.restype = [], ctypes.c_int
    return library


_OPENMP: list[Any] = []  # [library or None], looked up on first use


def _omp() -> Any:
    if not _OPENMP:
        _OPENMP.append(_openmp())
    return _OPENMP[0]


class Handle:
    """The result of one submitted task: :meth:`result` waits for it (running queued tasks
    meanwhile), then returns it or raises the task's exception in the caller's thread."""

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
    """Runs submitted tensor work on ``threads - 1`` workers (default
    ``torch.get_num_threads()``), each op on one intra-op thread, or at once with one."""

    def __init__(self, threads: int | None = None) -> None:
        threads = torch.get_num_threads() if threads is None else threads
        self._omp: Any = _omp() if threads > 1 else None
        self.concurrent = self._omp is not None
        self._queue: deque[Handle] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self._workers = [
            threading.Thread(target=self._serve, name=f"quantweave-convert-{i}", daemon=True)
            for i in range(threads - 1 if self.concurrent else 0)
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

    def _take(self) -> Handle | None:
        """The oldest queued task (taken off the queue), or None."""
        with self._changed:
            if not self._queue:
                return None
            handle = self._queue.popleft()
            handle._started = True
            return handle

    def _finish(self, handle: Handle) -> None:
        handle._run()
        with self._changed:
            self._changed.notify_all()

    def _serve(self) -> None:
        torch.get_num_threads()  # torch sets this thread's OpenMP threads on first use: before ours
        self._omp.omp_set_num_threads(1)
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
        """Until ``handle`` is done, run queued tasks here (one intra-op thread, as the workers)."""
        before = self._omp.omp_get_max_threads()
        try:
            while not handle._done:
                if self._closed and not handle._started:
                    raise RuntimeError("quantweave: a task was dropped before it ran (its TensorWork was closed)")
                task = self._take()
                if task is not None:
                    self._omp.omp_set_num_threads(1)
                    self._finish(task)
                    continue
                with self._changed:
                    if not handle._done and not self._queue:
                        self._changed.wait()
        finally:
            self._omp.omp_set_num_threads(before)

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

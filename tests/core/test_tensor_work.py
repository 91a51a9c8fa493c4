"""convert's tensor work on worker threads (``_modules/tensor_work``): the same results, errors
raised in the caller's thread, one intra-op thread per working thread, no thread left behind."""

import threading

import pytest
import torch

from quantweave._modules.tensor_work import PerThread, TensorWork


def _workers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("quantweave-convert")]


def _fail(name: str) -> None:
    raise ValueError(f"cannot observe {name}")


def test_one_thread_runs_each_task_at_once_in_the_callers_thread():
    ran: list[str] = []
    with TensorWork(threads=1) as work:
        assert not work.concurrent and _workers() == []
        handle = work.submit(lambda: ran.append(threading.current_thread().name) or torch.is_grad_enabled())
        assert ran == [threading.current_thread().name]  # before result() is asked for
        assert handle.result() is False  # under no_grad
        failed = work.submit(_fail, "weight_3")
        with pytest.raises(ValueError, match="weight_3"):
            failed.result()


def test_two_threads_same_results_errors_in_the_caller_no_thread_left():
    x = torch.randn(300, 64)
    expected = [(x * i).round().to(torch.int8) for i in range(8)]
    threads_seen: list[int] = []

    def task(i: int) -> torch.Tensor:
        threads_seen.append(torch.get_num_threads())
        return (x * i).round().to(torch.int8)

    with TensorWork(threads=2) as work:
        assert work.concurrent and len(_workers()) == 1
        handles = [work.submit(task, i) for i in range(8)]
        failed = work.submit(_fail, "linear_7.weight")
        results = [h.result() for h in handles]
        with pytest.raises(ValueError, match=r"linear_7\.weight"):
            failed.result()
    assert all(torch.equal(a, b) for a, b in zip(results, expected, strict=True))
    assert threads_seen and all(n == torch.get_num_threads() for n in threads_seen)  # torch's setting, as any op
    assert _workers() == []


def test_a_task_dropped_by_close_raises_instead_of_waiting():
    release, started = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return release.wait()

    work = TensorWork(threads=2)
    assert work.concurrent
    busy = work.submit(hold)  # keeps the worker busy
    dropped = work.submit(lambda: 1)
    assert started.wait(60)
    with work._changed:  # the caller closed before waiting (the worker is still busy)
        work._closed = True
        work._queue.clear()
    with pytest.raises(RuntimeError, match="dropped"):
        dropped.result()
    release.set()
    work.close()
    assert busy.result() is True
    assert _workers() == []


def test_per_thread_objects():
    made = PerThread(object)
    mine = made.get()
    assert made.get() is mine
    other: list[object] = []
    thread = threading.Thread(target=lambda: other.append(made.get()))
    thread.start()
    thread.join()
    assert other[0] is not mine


def test_a_dispatch_mode_of_the_caller_keeps_the_work_in_its_thread():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[object] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Record(), TensorWork(threads=2) as work:
        assert not work.concurrent  # a worker thread would not see the mode
        work.submit(torch.ones(3).add, 1).result()
    assert seen

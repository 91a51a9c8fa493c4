"""The few collectives :mod:`quantweave.distributed` needs, each bounded by a timeout.

:class:`LocalGroup` is a group of one process (no ``torch.distributed`` process group, e.g.
a plain ``python`` run): every collective is the identity. :class:`TorchGroup` runs them on a
``torch.distributed`` process group with public API only; every wait is bounded by
``timeout`` (``Work.wait(timeout)``; on gloo the join is a ``monitored_barrier``, which names
the ranks that did not arrive). A failure or timeout becomes a
:class:`~quantweave.errors.DistributedSyncError` naming the step and this rank.
"""

from __future__ import annotations

import datetime
import pickle
from typing import Any

import torch
import torch.distributed as dist

from ..errors import DistributedSyncError

__all__ = ["LocalGroup", "TorchGroup", "as_timedelta", "group_for"]


def as_timedelta(timeout: float | datetime.timedelta | None) -> datetime.timedelta | None:
    """``timeout`` as a timedelta (seconds when a number); None stays None."""
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds or a timedelta; got {timeout!r}")
    return datetime.timedelta(seconds=float(timeout))


class LocalGroup:
    """A group of one process: nothing to exchange."""

    rank = 0
    world_size = 1
    device = torch.device("cpu")

    def join(self, api: str) -> None:
        return None

    def gather_objects(self, obj: Any, api: str, step: str) -> list[Any]:
        return [obj]

    def reduce(self, tensor: torch.Tensor, op: str, api: str, step: str) -> torch.Tensor:
        return tensor


class TorchGroup:
    """Collectives on a ``torch.distributed`` process group, each wait bounded by ``timeout``
    (None: the process group's own timeout, set by ``init_process_group(timeout=...)``)."""

    def __init__(self, group: Any, timeout: datetime.timedelta | None) -> None:
        self.group = group
        self.timeout = timeout
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        if self.backend == "nccl":  # pragma: no cover - needs CUDA
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")

    def _fail(self, api: str, step: str, error: BaseException) -> DistributedSyncError:
        limit = f"{self.timeout.total_seconds():g} s" if self.timeout is not None else "the process group's timeout"
        return DistributedSyncError(
            f"{api}: rank {self.rank} of {self.world_size} failed at step {step!r} "
            f"(each wait bounded by {limit}): {type(error).__name__}: {error}. A rank failed, "
            "exited or did not call it in time; observers were left as they were. After a "
            "timeout or a lost rank the process group is no longer usable: destroy it."
        )

    def _wait(self, work: Any, api: str, step: str) -> None:
        try:
            if self.timeout is None:
                work.wait()
            else:
                work.wait(self.timeout)
        except Exception as error:  # torch raises RuntimeError / DistBackendError subclasses
            raise self._fail(api, step, error) from error

    def join(self, api: str) -> None:
        """Every rank arrives, within the timeout (gloo names the ranks that did not)."""
        try:
            if self.backend == "gloo":
                dist.monitored_barrier(self.group, timeout=self.timeout, wait_all_ranks=True)
                return
            work = dist.barrier(self.group, async_op=True)
        except Exception as error:
            raise self._fail(api, "join", error) from error
        self._wait(work, api, "join")

    def gather_objects(self, obj: Any, api: str, step: str) -> list[Any]:
        """``obj`` of every rank, in rank order (pickled; sizes first, then padded bytes)."""
        data = pickle.dumps(obj)
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        try:
            work = dist.all_gather(sizes, size, group=self.group, async_op=True)
        except Exception as error:
            raise self._fail(api, step, error) from error
        self._wait(work, api, step)
        longest = max(int(s.item()) for s in sizes)
        payload = torch.zeros(longest, dtype=torch.uint8)
        payload[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        payload = payload.to(self.device)
        gathered = [torch.zeros_like(payload) for _ in range(self.world_size)]
        try:
            work = dist.all_gather(gathered, payload, group=self.group, async_op=True)
        except Exception as error:
            raise self._fail(api, step, error) from error
        self._wait(work, api, step)
        # the ranks of one job unpickle each other's inventories (as all_gather_object does)
        return [pickle.loads(bytes(t[: int(s.item())].cpu().tolist())) for t, s in zip(gathered, sizes, strict=True)]

    def reduce(self, tensor: torch.Tensor, op: str, api: str, step: str) -> torch.Tensor:
        """All-reduce (``"min"`` or ``"sum"``) of a copy of ``tensor``; the result is on the CPU."""
        if tensor.numel() == 0:  # every rank agreed on the same (empty) layout
            return tensor.clone()
        ops = {"min": dist.ReduceOp.MIN, "sum": dist.ReduceOp.SUM}
        result = tensor.to(self.device, copy=True)
        try:
            work = dist.all_reduce(result, op=ops[op], group=self.group, async_op=True)
        except Exception as error:
            raise self._fail(api, step, error) from error
        self._wait(work, api, step)
        return result.cpu()


def group_for(group: Any, timeout: float | datetime.timedelta | None) -> LocalGroup | TorchGroup:
    """The collectives for ``group`` (None: the default group). Without an initialized
    default process group, a group of one process."""
    limit = as_timedelta(timeout)
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return LocalGroup()
    return TorchGroup(group, limit)

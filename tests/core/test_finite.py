"""``_modules/finite.all_finite_pair``: the exact checks' verdicts, in fewer ops when the total is finite, and
none for a pair proven finite earlier in a ``remembering_proofs`` block (convert's call), unchanged since."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from quantweave._modules.finite import all_finite_pair, remembering_proofs
from quantweave.observers import MinMaxObserver, PerChannelMinMaxObserver, is_calibrated


def _exact(values):
    return bool(torch.isfinite(values).all())


BIG = torch.finfo(torch.float32).max


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        (torch.tensor([1.0, -2.0]), torch.tensor([3.0]), True),
        (torch.tensor([BIG, BIG]), torch.tensor([BIG]), True),  # the sum overflows: settled exactly
        (torch.tensor([1.0, float("inf")]), torch.tensor([1.0]), False),
        (torch.tensor([1.0]), torch.tensor([float("-inf")]), False),
        (torch.tensor([float("inf")]), torch.tensor([float("-inf")]), False),  # total NaN
        (torch.tensor([float("nan")]), torch.tensor([1.0]), False),
        (torch.tensor([60000.0, 60000.0], dtype=torch.float16), torch.tensor([1.0], dtype=torch.float16), True),
        (torch.tensor([1, 2]), torch.tensor([3]), True),  # integers: the exact check
    ],
)
def test_same_verdict_as_the_exact_check(first, second, expected):
    calls = []

    def exact(values):
        calls.append(values)
        return _exact(values)

    assert all_finite_pair(first, second, exact) is expected
    assert expected == (_exact(first) and _exact(second))
    if not calls:  # the fast path answered: only when both are finite
        assert expected


def test_is_calibrated_unchanged():
    for observer_class in (MinMaxObserver, PerChannelMinMaxObserver):
        observer = observer_class()
        assert not is_calibrated(observer)
        observer(torch.randn(4, 3))
        assert is_calibrated(observer)
        observer.min_val = torch.full_like(observer.min_val, float("nan"))
        assert not is_calibrated(observer)
        observer.min_val = torch.full_like(observer.min_val, -float("inf"))
        assert not is_calibrated(observer)


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _ops_and_verdict(first, second):
    with _CountOps() as count:
        verdict = all_finite_pair(first, second, _exact)
    return count.ops, verdict


def test_a_pair_proven_finite_is_not_checked_again_while_unchanged():
    low, high = torch.tensor([-1.0, 0.5]), torch.tensor([2.0, 3.0])
    assert _ops_and_verdict(low, high)[0] > 0  # outside a block: checked every time
    assert _ops_and_verdict(low, high)[0] > 0
    with remembering_proofs():
        assert _ops_and_verdict(low, high)[0] > 0
        assert _ops_and_verdict(low, high) == (0, True)  # proven, unchanged: no op
        assert _ops_and_verdict(high, low)[0] > 0  # another pair (the order matters)
        low[1] = float("inf")  # written in place: its version moved
        assert _ops_and_verdict(low, high)[1] is False
        assert _ops_and_verdict(low, high)[1] is False  # a pair found not finite is never remembered
        low[1] = 0.5
        assert _ops_and_verdict(low, high) == (_ops_and_verdict(low.clone(), high)[0], True)  # checked again
        other = low.clone()
        assert _ops_and_verdict(other, high)[0] > 0  # another tensor with the same values: checked
    assert _ops_and_verdict(low, high)[0] > 0  # the block is over: nothing remembered


def test_inference_tensors_are_checked_every_time():
    with torch.inference_mode():
        low, high = torch.tensor([-1.0]), torch.tensor([2.0])
    with remembering_proofs():
        assert _ops_and_verdict(low, high)[0] > 0
        assert _ops_and_verdict(low, high)[0] > 0

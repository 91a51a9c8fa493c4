"""``_modules/finite.all_finite_pair``: the exact checks' verdicts, in fewer ops when the total is finite."""

import pytest
import torch

from quantweave._modules.finite import all_finite_pair
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

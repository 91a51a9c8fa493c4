"""HistogramObserver's min/max search takes its runs of still steps in one go
(quantweave._modules.histogram_search) and still ends where torch's step-by-step search ends."""

import pytest
import torch
from torch.ao.quantization.observer import HistogramObserver as TorchHistogramObserver

from quantweave._modules.histogram_search import beta_after_still_steps
from quantweave.observers import HistogramObserver

SMALL = {
    "eight": lambda g: torch.randn(8, generator=g),  # long still runs: few counts in 2048 bins
    "three_values": lambda g: torch.tensor([-1.0, 0.25, 4.0]),
    "two_clusters": lambda g: torch.cat([torch.randn(20, generator=g) - 50, torch.randn(20, generator=g) + 50]),
    "post_relu_small": lambda g: torch.relu(torch.randn(33, generator=g)),
    "one_outlier": lambda g: torch.cat([torch.randn(200, generator=g), torch.tensor([1e4])]),
    "skewed": lambda g: torch.rand(500, generator=g) ** 8,
}


@pytest.mark.parametrize("bins", [2048, 256, 3])
@pytest.mark.parametrize("kind", sorted(SMALL))
@pytest.mark.parametrize("seed", range(3))
def test_search_ends_where_torch_s_search_ends(kind, bins, seed):
    data = SMALL[kind](torch.Generator().manual_seed(seed))
    ours, theirs = HistogramObserver(bins=bins), TorchHistogramObserver(bins=bins)
    for chunk in data.split(max(1, data.numel() // 3)):
        ours(chunk)
        theirs(chunk)
    assert torch.equal(ours.histogram, theirs.histogram)
    got = ours.search_min_max()
    expected = theirs._non_linear_param_search()
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), (got, expected)


def _still_steps_one_by_one(alpha, beta, stepsize, total, end_count, end_can_move):
    """The search loop's still steps, one at a time (the loop this module replaces)."""
    import struct

    while alpha < beta:
        next_beta = beta - stepsize
        high = struct.unpack("f", struct.pack("f", next_beta * total))[0]
        if end_can_move and end_count > high:
            return beta
        beta = next_beta
    return beta


@pytest.mark.parametrize("seed", range(30))
def test_a_run_of_still_steps_ends_at_the_loop_s_beta(seed):
    gen = torch.Generator().manual_seed(seed)
    total = float(torch.randint(1, 10**6, (1,), generator=gen))
    alpha = float(torch.rand(1, generator=gen)) * 0.3
    beta = 1.0 - float(torch.rand(1, generator=gen)) * 0.3
    # an end count just under some quantile the walk will cross, float32-exact as a cumsum's
    end_count = float(torch.tensor(total * float(torch.rand(1, generator=gen)), dtype=torch.float32))
    for end_can_move in (True, False):
        args = (alpha, beta, 1e-5, total, end_count, end_can_move)
        assert beta_after_still_steps(*args) == _still_steps_one_by_one(*args)

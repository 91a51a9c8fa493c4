"""The stretches of HistogramObserver's min/max search in which no bin moves, taken in one go.

torch's search (``_non_linear_param_search``) walks ``alpha`` up from 0 and ``beta`` down from 1
in steps of 1e-5; on each step it looks for the bins the two new quantiles fall in, and only
when a bin moves does it compute a quantization error. On a step where neither bin moves it
keeps ``alpha`` and lowers ``beta`` by one step: up to 100,000 Python iterations that change
nothing but ``beta`` (about 15 ms for a tensor of 8 values). :func:`beta_after_still_steps` gives
the ``beta`` those iterations end with, from the same float64 subtractions and products and the
same float32 roundings, computed a block of steps at a time as tensors.
"""

from __future__ import annotations

import struct

import torch

__all__ = ["beta_after_still_steps"]

#: still steps taken one by one before the blocks (most runs are short: a tensor op costs
#: about as much as 30 of the loop's steps)
_ONE_BY_ONE = 64
#: steps in the first block; each next block is four times longer, up to ``_MAX_BLOCK``
_FIRST_BLOCK = 512
_MAX_BLOCK = 1 << 16


def beta_after_still_steps(
    alpha: float, beta: float, stepsize: float, total: float, end_count: float, end_can_move: bool
) -> float:
    """``beta`` once the search's run of still steps ends.

    The caller has just taken a step on which neither bin moved, with ``beta`` already lowered.
    The next steps stay still while ``alpha < beta`` (the loop's condition) and the upper bin
    does not move: it moves when ``end_can_move`` (the upper bin is above the lower one) and the
    float32 quantile ``f32((beta - stepsize) * total)`` falls below ``end_count``, the cumulative
    count at the upper bin (the lower bin's quantile depends on ``alpha`` alone and so stays
    put). Returned: ``beta`` before the first step that is not still, i.e. after every still
    step -- the value the step-by-step loop reaches, since ``torch.cumsum`` over float64 adds
    in index order (the loop's repeated ``beta - stepsize``), the products are float64 and the
    float32 cast rounds as Python's ``struct`` does, to nearest even."""
    for _ in range(_ONE_BY_ONE):
        if not alpha < beta:
            return beta
        next_beta = beta - stepsize
        if end_can_move and end_count > struct.unpack("f", struct.pack("f", next_beta * total))[0]:
            return beta
        beta = next_beta
    size = _FIRST_BLOCK
    while True:
        steps = torch.full((size + 1,), -stepsize, dtype=torch.float64)
        steps[0] = beta
        betas = torch.cumsum(steps, 0)  # betas[k]: beta after k more steps
        stops = alpha >= betas[:-1]  # step k + 1 is not taken
        if end_can_move:
            quantiles = (betas[1:] * total).to(torch.float32)
            stops |= quantiles < end_count  # step k + 1 moves the upper bin
        if bool(stops.any()):
            first = int(torch.argmax(stops.to(torch.uint8)))
            return float(betas[first])
        beta = float(betas[-1])
        size = min(size * 4, _MAX_BLOCK)

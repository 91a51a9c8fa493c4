"""quantweave.observers: our HistogramObserver search gives torch's exact qparams."""

import math

import pytest
import torch
from torch.ao.quantization.observer import HistogramObserver as TorchHistogramObserver

from quantweave.observers import DerivedObserver, HistogramObserver, MinMaxObserver, is_calibrated

DATA = {
    "gaussian": lambda g: torch.randn(4000, generator=g) * 3,
    "heavy_tail": lambda g: torch.rand(4000, generator=g) ** 3 * 10,
    "outliers": lambda g: torch.cat([torch.randn(4000, generator=g), torch.randn(4, generator=g) * 60]),
    "post_relu": lambda g: torch.relu(torch.randn(4000, generator=g)),
    "constant": lambda g: torch.full((100,), 0.5),
}


@pytest.mark.parametrize("kind", sorted(DATA))
@pytest.mark.parametrize(
    ("dtype", "qmin", "qmax"), [(torch.uint8, 0, 255), (torch.int8, -128, 127), (torch.uint8, 0, 127)]
)
def test_histogram_qparams_are_identical_to_torch(kind, dtype, qmin, qmax):
    data = DATA[kind](torch.Generator().manual_seed(3))
    ours = HistogramObserver(dtype=dtype, quant_min=qmin, quant_max=qmax, eps=2**-12)
    theirs = TorchHistogramObserver(dtype=dtype, quant_min=qmin, quant_max=qmax, eps=2**-12)
    for chunk in data.split(700):
        ours(chunk)
        theirs(chunk)
    scale, zero_point = ours.calculate_qparams()
    expected_scale, expected_zero_point = theirs.calculate_qparams()
    assert torch.equal(scale, expected_scale) and torch.equal(zero_point, expected_zero_point)


def test_calibration_state_is_detected():
    observer = MinMaxObserver(dtype=torch.uint8)
    assert not is_calibrated(observer)
    observer(torch.randn(3))
    assert is_calibrated(observer)
    derived = DerivedObserver(
        [observer], lambda obs: obs[0].calculate_qparams(), torch.int32, -(2**31), 2**31 - 1, torch.per_tensor_symmetric
    )
    assert is_calibrated(derived) and torch.equal(derived(torch.ones(2)), torch.ones(2))


# -- faster observers (issue 14): the same state, histograms and qparams as torch's ---------------

ADVERSARIAL = {
    **DATA,
    "growing": lambda g: torch.cat([torch.randn(500, generator=g) * (i + 1) for i in range(8)]),
    "tiny": lambda g: torch.randn(4000, generator=g) * 1e-30,
    "huge": lambda g: torch.randn(4000, generator=g) * 1e30,
    "subnormal": lambda g: torch.cat([torch.randn(500 * (i + 1), generator=g) * 1e-39 * (i + 1) for i in range(4)]),
    "extremes": lambda g: torch.cat([torch.randn(3000, generator=g), torch.tensor([3.0e38, -3.0e38])]),
    "integers": lambda g: torch.randint(-3, 4, (4000,), generator=g).float(),
    "zeros": lambda g: torch.zeros(2000),
    "one_value_then_spread": lambda g: torch.cat([torch.full((700,), -2.0), torch.randn(3300, generator=g)]),
    "with_inf": lambda g: torch.cat([torch.randn(3000, generator=g), torch.tensor([float("inf")])]),
    # every bin edge of [-3, 5] in 2048 bins and its float32 neighbours
    "on_edges": lambda g: torch.cat([_EDGES, torch.nextafter(_EDGES, _EDGES + 1), torch.nextafter(_EDGES, _EDGES - 1)])[
        torch.randperm(3 * 2049, generator=g)
    ],
}
_EDGES = torch.linspace(-3, 5, 2049)


def _same_state(ours, theirs, names=("min_val", "max_val")) -> bool:
    return all(torch.equal(getattr(ours, n), getattr(theirs, n)) for n in names)


@pytest.mark.slow  # the histogram grid (tox env slow)
@pytest.mark.filterwarnings("ignore:torch.inf detected")
@pytest.mark.parametrize("kind", sorted(ADVERSARIAL))
@pytest.mark.parametrize("bins", [2048, 300])
@pytest.mark.parametrize(
    ("dtype", "qscheme", "qmin", "qmax"),
    [(torch.quint8, torch.per_tensor_affine, 0, 255), (torch.qint8, torch.per_tensor_symmetric, -128, 127)],
)
def test_histogram_observer_keeps_torch_s_histogram_state_and_qparams_after_every_batch(
    kind, bins, dtype, qscheme, qmin, qmax
):
    data = ADVERSARIAL[kind](torch.Generator().manual_seed(5))
    kwargs = {"bins": bins, "dtype": dtype, "qscheme": qscheme, "quant_min": qmin, "quant_max": qmax}
    theirs, ours = TorchHistogramObserver(**kwargs), HistogramObserver(**kwargs)
    for chunk in data.split(500):
        theirs(chunk)
        ours(chunk)
        assert _same_state(ours, theirs, ("min_val", "max_val", "histogram"))
    scale, zero_point = ours.calculate_qparams()
    expected = theirs.calculate_qparams()
    if kind != "huge":
        assert torch.equal(scale, expected[0]) and torch.equal(zero_point, expected[1])
        return
    # values ~1e30: torch's float32 search error overflows (NaN) and its search runs on,
    # clipping half the data (affine: zero point 255); quantweave's takes that error in
    # float64 (test_fuzz_regressions.py), so its qparams are never worse than torch's
    assert _rms_error(data, scale, zero_point, qmin, qmax) <= _rms_error(data, *expected, qmin, qmax)


def _rms_error(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int, qmax: int) -> float:
    x, s, z = x.double(), float(scale), int(zero_point)
    q = torch.clamp(torch.round(x / s) + z, qmin, qmax)
    return float(((q - z) * s - x).pow(2).mean().sqrt())


def test_fast_histogram_observer_is_the_default_under_its_old_name():
    from quantweave.observers import FastHistogramObserver

    assert FastHistogramObserver is HistogramObserver


@pytest.mark.parametrize("seed", range(6))
def test_histogram_observer_matches_torch_on_activation_like_batches(seed):
    """Shapes and ranges as in a calibration: 2-d and 4-d batches, post-ReLU, softmax-like,
    growing and shrinking ranges, a batch with one value, a batch in [0, 0]."""
    gen = torch.Generator().manual_seed(seed)
    batches = [
        torch.relu(torch.randn(2, 16, 9, 9, generator=gen)),
        torch.softmax(torch.randn(4, 33, generator=gen) * 3, -1),
        torch.randn(3, 700, generator=gen) * 4,
        torch.full((5, 5), 2.5),
        torch.randn(1, 128, 64, generator=gen) * 0.5,
        torch.zeros(7),
        torch.randn(64, generator=gen) * 40,
        torch.randn(2, 3, generator=gen).t(),  # not contiguous
    ]
    order = torch.randperm(len(batches), generator=gen).tolist()
    theirs, ours = TorchHistogramObserver(), HistogramObserver()
    for i in order:
        theirs(batches[i])
        ours(batches[i])
        assert _same_state(ours, theirs, ("min_val", "max_val", "histogram")), i
    assert all(torch.equal(a, b) for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams(), strict=True))


@pytest.mark.parametrize("seed", range(40))
def test_rebinning_is_torch_s_bit_for_bit(seed):
    """``_upscale_histogram`` (run when a batch widens the range) against torch's, on
    histograms with fractional counts (as after earlier re-binnings) and ranges from tiny to
    huge, narrow and wide widenings."""
    gen = torch.Generator().manual_seed(seed)
    bins = (2048, 300, 64, 7)[seed % 4]
    scale = 10.0 ** float(torch.randint(-30, 30, (1,), generator=gen))
    lo = float(torch.randn(1, generator=gen)) * scale
    hi = lo + float(torch.rand(1, generator=gen) + 1e-3) * scale
    grow_lo, grow_hi = (float(v) * scale for v in torch.rand(2, generator=gen) ** 4)
    ours, theirs = HistogramObserver(bins=bins), TorchHistogramObserver(bins=bins)
    histogram = torch.rand(bins, generator=gen) ** 3 * 1e4 / 7  # fractional counts
    ends = [torch.tensor(v, dtype=torch.float32) for v in (lo, hi, lo - grow_lo, hi + grow_hi)]
    expected = theirs._upscale_histogram(histogram, *ends)
    got = ours._upscale_histogram(histogram, *ends)
    assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_counting_mid_points_below_boundaries_equals_searchsorted():
    from quantweave.observers import _count_below

    gen = torch.Generator().manual_seed(0)
    cases = [
        (-1.0, 1.0, -1.01, 1.0),
        (-1.0, 1.0, -5.0, 5.0),
        (1000.0, 1000.001, 999.9, 1000.1),
        (0.0, 1e-30, -1e-30, 2e-30),
    ]
    cases += [(-3e38, 3e38, -3e38, 3e38), (0.0, 1.0, 0.0, 1.0), (0.0, 1e-38, -1e-38, 2e-38), (5e-39, 6e-39, 0.0, 1e-38)]
    for _ in range(30):
        lo, width = float(torch.randn(1, generator=gen)) * 5, float(torch.rand(1, generator=gen)) * 10 + 1e-6
        cases.append((lo, lo + width, lo - width * float(torch.rand(1, generator=gen)), lo + width * 1.5))
    for lo, hi, new_lo, new_hi in cases:
        for parts, queries in ((32768, 2049), (4800, 301), (16, 2)):
            padded = torch.empty(parts + 2)
            torch.linspace(lo, hi, parts + 1, out=padded[1:])
            padded[1:-1].add_(torch.tensor((hi - lo) / parts / 2, dtype=torch.float32))
            padded[0], padded[-1] = -math.inf, math.inf
            boundaries = torch.linspace(new_lo, new_hi, queries)
            expected = torch.searchsorted(padded[1:-1], boundaries)
            assert torch.equal(_count_below(padded, boundaries), expected), (lo, hi, new_lo, new_hi, parts)


def test_segment_sum_adds_like_bincount():
    from quantweave._modules.torch_compat import segment_sum

    gen = torch.Generator().manual_seed(1)
    values = torch.rand(5000, generator=gen) ** 4 * 1e6 / 3
    cuts = torch.sort(torch.randint(0, 5001, (299,), generator=gen)).values
    offsets = torch.cat([torch.tensor([0]), cuts, torch.tensor([5000])])  # empty runs included
    index = torch.repeat_interleave(torch.arange(300), offsets.diff())
    expected = torch.bincount(index, weights=values, minlength=300)
    assert torch.equal(segment_sum(values, offsets), expected)


@pytest.mark.parametrize("case", ["float64", "double_state", "infinity_later"])
def test_histogram_observer_defers_to_torch_outside_its_fast_path(case):
    import warnings

    theirs, ours = TorchHistogramObserver(), HistogramObserver()
    batches = [torch.randn(300), torch.randn(300) * 2]
    if case == "float64":
        batches = [b.double() for b in batches]
    if case == "double_state":
        theirs, ours = theirs.double(), ours.double()
    if case == "infinity_later":
        batches.append(torch.tensor([1.0, math.inf, -7.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in batches:
            theirs(batch)
            ours(batch)
            assert _same_state(ours, theirs, ("min_val", "max_val", "histogram"))


@pytest.mark.parametrize(
    "kind", ["gaussian", "post_relu", "integers", "zeros", "extremes", "tiny", "huge", "on_edges", "growing"]
)
@pytest.mark.parametrize(("lo_pad", "hi_pad"), [(0.0, 0.0), (0.37, 1.5), (1e-7, 0.0)])
def test_exact_histc_counts_like_torch_histc(kind, lo_pad, hi_pad):
    from quantweave.observers import exact_histc

    data = ADVERSARIAL[kind](torch.Generator().manual_seed(11))
    lo, hi = float(data.min()) - lo_pad, float(data.max()) + hi_pad
    for bins in (2048, 256, 300, 7, 1):
        assert torch.equal(exact_histc(data, bins, lo, hi), torch.histc(data, bins, min=lo, max=hi))
    # outside the range (skipped by torch), other dtypes: it defers to torch.histc
    assert torch.equal(exact_histc(data, 64, lo / 2, hi / 2), torch.histc(data, 64, min=lo / 2, max=hi / 2))
    half = data.double()
    assert torch.equal(exact_histc(half, 64, lo, hi), torch.histc(half, 64, min=lo, max=hi))


@pytest.mark.parametrize("ch_axis", [0, 1])
@pytest.mark.parametrize(
    ("dtype", "qscheme"), [(torch.qint8, torch.per_channel_symmetric), (torch.quint8, torch.per_channel_affine)]
)
def test_per_channel_observer_keeps_torch_s_state_and_skips_an_unchanged_weight(ch_axis, dtype, qscheme):
    from torch.ao.quantization.observer import PerChannelMinMaxObserver as TorchPerChannel

    from quantweave.observers import PerChannelMinMaxObserver

    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(16, 8, 3, 3, generator=gen)
    weight[3] = 0.0  # an all-zero channel
    weight[5, 0, 0, 0] = 1e30  # an extreme value
    kwargs = {"ch_axis": ch_axis, "dtype": dtype, "qscheme": qscheme}
    ours, theirs = PerChannelMinMaxObserver(**kwargs), TorchPerChannel(**kwargs)

    def both(x):
        ours(x)
        theirs(x)
        assert _same_state(ours, theirs)
        assert all(torch.equal(a, b) for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams(), strict=True))

    both(weight)
    calls = []
    original_amin = torch.amin
    try:
        torch.amin = lambda *a, **k: calls.append(1) or original_amin(*a, **k)  # type: ignore[assignment]
        both(weight)  # the same tensor, unchanged: skipped
        assert calls == []
        both(torch.randn(16, 8, 3, 3, generator=gen) * 5)  # another tensor: observed
        assert calls
        calls.clear()
        both(weight)  # observed again (the last tensor seen was another one)
        assert calls
        calls.clear()
        with torch.no_grad():
            weight.mul_(3)  # changed in place (a QAT / optimizer step): observed again
        both(weight)
        assert calls
        calls.clear()
        ours.reset_min_max_vals()
        theirs.reset_min_max_vals()
        both(weight)  # after a reset the same tensor is observed again
        assert calls
    finally:
        torch.amin = original_amin
    with torch.inference_mode():  # inference tensors have no version counter: never skipped
        frozen = torch.randn(16, 8, 3, 3)
    both(frozen)
    both(frozen)

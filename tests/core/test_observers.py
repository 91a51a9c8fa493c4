"""quantweave.observers: our HistogramObserver search gives torch's exact qparams."""

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


@pytest.mark.filterwarnings("ignore:torch.inf detected")
@pytest.mark.parametrize("kind", sorted(ADVERSARIAL))
@pytest.mark.parametrize("bins", [2048, 300])
@pytest.mark.parametrize(
    ("dtype", "qscheme", "qmin", "qmax"),
    [(torch.quint8, torch.per_tensor_affine, 0, 255), (torch.qint8, torch.per_tensor_symmetric, -128, 127)],
)
def test_histogram_observers_keep_torch_s_histogram_state_and_qparams(kind, bins, dtype, qscheme, qmin, qmax):
    from quantweave.observers import FastHistogramObserver

    data = ADVERSARIAL[kind](torch.Generator().manual_seed(5))
    kwargs = {"bins": bins, "dtype": dtype, "qscheme": qscheme, "quant_min": qmin, "quant_max": qmax}
    theirs = TorchHistogramObserver(**kwargs)
    ours = [HistogramObserver(**kwargs), FastHistogramObserver(**kwargs)]
    for chunk in data.split(500):
        for observer in (theirs, *ours):
            observer(chunk)
    expected = theirs.calculate_qparams()
    for observer in ours:
        assert _same_state(observer, theirs, ("min_val", "max_val", "histogram")), type(observer).__name__
        scale, zero_point = observer.calculate_qparams()
        assert torch.equal(scale, expected[0]) and torch.equal(zero_point, expected[1]), type(observer).__name__


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

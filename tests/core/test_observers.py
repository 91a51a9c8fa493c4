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

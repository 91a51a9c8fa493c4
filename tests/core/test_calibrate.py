"""quantweave.calibrate: no_grad, progress (bar, silence, callback), observers that saw data."""

import io
import sys

import pytest
import torch

import quantweave as qw
from quantweave.testing.models import calibration_batches, example_inputs, resnet18_like
from quantweave.testing.reference import make_reference_quantizer
from tests.helpers import assert_names, export


class Branches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def prepared_model(model=None):
    model = model or resnet18_like(blocks=(1, 1), width=16, num_classes=10)
    args = (torch.randn(2, 4),) if isinstance(model, Branches) else example_inputs(model)
    return model, qw.prepare_pt2e(export(model, *args), make_reference_quantizer())


def test_callback_counts_every_batch_with_the_total():
    model, prepared = prepared_model()
    calls = []
    result = qw.calibrate(
        prepared, calibration_batches(model, 5), progress=lambda done, total: calls.append((done, total))
    )
    assert calls == [(i, 5) for i in range(1, 6)]
    assert result.batches == 5
    assert result.observers > 0 and result.observed == result.observers and result.not_observed == ()
    assert str(result) == f"5 batches, {result.observers} of {result.observers} observers saw data"
    qw.convert_pt2e(prepared)  # calibrated as convert judges it


def test_unknown_length_is_none_unless_total_is_given():
    model, prepared = prepared_model()
    calls = []
    qw.calibrate(prepared, iter(calibration_batches(model, 3)), progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, None), (2, None), (3, None)]
    calls.clear()
    qw.calibrate(prepared, iter(calibration_batches(model, 2)), progress=lambda d, t: calls.append((d, t)), total=2)
    assert calls == [(1, 2), (2, 2)]


def test_runs_under_no_grad_and_accepts_tensors_tuples_and_mappings():
    seen = []
    model = Branches()
    _, prepared = prepared_model(model)
    prepared.register_forward_pre_hook(lambda m, a: seen.append(torch.is_grad_enabled()))
    x = torch.randn(2, 4)
    qw.calibrate(prepared, [x, (x,), [x], {"x": x}], progress=False)
    assert seen == [False] * 4


def test_observers_that_saw_no_data_are_named():
    model = Branches()
    _, prepared = prepared_model(model)
    result = qw.calibrate(prepared, [], progress=False)
    assert result.batches == 0 and result.observed < result.observers
    assert result.not_observed and all(name.startswith("activation_post_process") for name in result.not_observed)
    with pytest.raises(qw.ObserverNotCalibratedError):
        qw.convert_pt2e(prepared)


def test_bar_on_a_terminal_silence_elsewhere(monkeypatch):
    pytest.importorskip("tqdm")
    _, prepared = prepared_model(Branches())
    batches = [(torch.randn(2, 4),) for _ in range(3)]

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, progress, drawn in [
        (Terminal(), None, True),  # a terminal and a known length: a bar
        (io.StringIO(), None, False),  # a pipe or a log: silent
        (io.StringIO(), True, True),  # forced
        (Terminal(), False, False),  # refused
    ]:
        monkeypatch.setattr(sys, "stderr", stream)
        qw.calibrate(prepared, batches, progress=progress)
        out = stream.getvalue()
        assert ("calibrating" in out and "3/3" in out) == drawn, (progress, out)
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    qw.calibrate(prepared, iter(batches), progress=None)  # unknown length: no bar without progress=True
    assert stream.getvalue() == ""


def test_bad_arguments():
    _, prepared = prepared_model(Branches())
    with pytest.raises(TypeError) as info:
        qw.calibrate(prepared, [], progress="yes")
    assert_names(info, "progress", "None, a bool or a callable")
    with pytest.raises(TypeError) as info:
        qw.calibrate(torch.nn.Linear(2, 2), [])
    assert_names(info, "GraphModule", "prepare_pt2e")

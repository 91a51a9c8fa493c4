"""prepare / convert hold off Python's cyclic garbage collector while they build graphs
(``_modules/gc_pause``, issue 25): disabled inside the call, the caller's state again after
it -- when it returns, when it raises, and left disabled for a caller that disabled it."""

import gc

import pytest
import torch

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map
from quantweave.observers import MinMaxObserver
from quantweave.plugin_api import mark_annotated
from tests.helpers import export


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


class _Recording(qw.Quantizer):
    """Annotates the linear's input; records whether the collector ran during annotate, and
    raises there when asked to."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.enabled_in_annotate: list[bool] = []

    def annotate(self, model):
        self.enabled_in_annotate.append(gc.isenabled())
        if self.fail:
            raise ValueError("annotate failed on purpose")
        spec = qw.QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver)
        for node in model.graph.nodes:
            if node.target == torch.ops.aten.linear.default:
                annotate_input_qspec_map(node, node.args[0], spec)
                mark_annotated(node)
        return model


@pytest.fixture
def collector_state():
    was = gc.isenabled()
    yield
    gc.enable() if was else gc.disable()


def _exported():
    return export(_Linear().eval(), torch.randn(2, 8))


def test_disabled_during_prepare_and_enabled_after(collector_state):
    gc.enable()
    quantizer = _Recording()
    prepared = qw.prepare_pt2e(_exported(), quantizer)
    assert quantizer.enabled_in_annotate == [False]
    assert gc.isenabled()
    prepared(torch.randn(2, 8))
    converted = qw.convert_pt2e(prepared)
    assert gc.isenabled()
    assert converted(torch.randn(2, 8)).shape == (2, 4)


def test_enabled_again_when_prepare_raises(collector_state):
    gc.enable()
    quantizer = _Recording(fail=True)
    with pytest.raises(ValueError, match="annotate failed on purpose"):
        qw.prepare_pt2e(_exported(), quantizer)
    assert quantizer.enabled_in_annotate == [False]
    assert gc.isenabled()


def test_enabled_again_when_convert_raises(collector_state):
    gc.enable()
    prepared = qw.prepare_pt2e(_exported(), _Recording())  # never calibrated: convert raises
    with pytest.raises(qw.ObserverNotCalibratedError):
        qw.convert_pt2e(prepared)
    assert gc.isenabled()


def test_a_caller_that_disabled_it_keeps_it_disabled(collector_state):
    gc.disable()
    quantizer = _Recording()
    prepared = qw.prepare_pt2e(_exported(), quantizer)
    assert not gc.isenabled()
    prepared(torch.randn(2, 8))
    qw.convert_pt2e(prepared)
    assert not gc.isenabled()
    with pytest.raises(ValueError, match="annotate failed on purpose"):
        qw.prepare_pt2e(_exported(), _Recording(fail=True))
    assert not gc.isenabled()

"""Bad input at convert (issue #20), the cases that need a real quantizer (x86): moved from
tests/core/test_bad_convert.py so that tests/core runs without plugins."""

from __future__ import annotations

import warnings

import pytest
import torch

import quantweave as qw
from quantweave.authoring import quantize_ops
from tests.helpers import CONV_RELU_INPUT, Snapshot, assert_names, exported_conv_relu


def _prepared(calibrated: bool = True) -> torch.fx.GraphModule:
    """tests.helpers.ConvRelu prepared by x86 (and calibrated on CONV_RELU_INPUT)."""
    prepared = qw.prepare_pt2e(exported_conv_relu(), qw.get_quantizer("x86"))
    if calibrated:
        prepared(CONV_RELU_INPUT)
    return prepared


def _converted() -> torch.fx.GraphModule:
    return qw.convert_pt2e(_prepared())


def test_converting_twice_warns_naming_a_quantize_node():
    converted = _converted()
    before = Snapshot.of(converted)
    with pytest.warns(qw.MisuseWarning) as caught:
        again = qw.convert_pt2e(converted)
    assert_names(caught, "converted already", "quantize/dequantize")
    assert torch.equal(again(CONV_RELU_INPUT), converted(CONV_RELU_INPUT))
    assert before.differences(converted) == []


def test_a_calibrated_prepared_model_converts_without_a_warning():
    prepared = _prepared()
    with warnings.catch_warnings():
        warnings.simplefilter("error", qw.MisuseWarning)
        converted = qw.convert_pt2e(prepared)
    assert any(n.target in quantize_ops() for n in converted.graph.nodes)


@pytest.mark.parametrize("fold", [1, "yes", None])
def test_fold_quantize_that_is_not_a_bool_raises_naming_the_value(fold):
    prepared = _prepared()
    before = Snapshot.of(prepared)
    with pytest.raises(TypeError) as info:
        qw.convert_pt2e(prepared, fold_quantize=fold)
    assert_names(info, "fold_quantize", "bool", repr(fold))
    assert before.differences(prepared) == []


def test_an_uncalibrated_model_raises_naming_its_observers():
    prepared = _prepared(calibrated=False)
    before = Snapshot.of(prepared)
    with pytest.raises(qw.ObserverNotCalibratedError, match=r"activation_post_process_\d+"):
        qw.convert_pt2e(prepared)
    assert before.differences(prepared) == []

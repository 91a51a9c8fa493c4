"""Bad input at convert (issue #20): converting what has no observers is no silent no-op.
Each case asserts the exception or warning class, that the message names the misuse (and
the node at fault where there is one), and that the model passed in is bit-identical
afterwards (tests.helpers.Snapshot)."""

from __future__ import annotations

import warnings

import pytest
import torch

import quantweave as qw
from tests.helpers import CONV_RELU_INPUT as X
from tests.helpers import ConvRelu as Net
from tests.helpers import Snapshot, assert_names
from tests.helpers import exported_conv_relu as _exported


def test_converting_a_model_that_was_never_prepared_warns_and_returns_a_float_copy():
    gm = _exported()
    before = Snapshot.of(gm)
    with pytest.warns(qw.MisuseWarning) as caught:
        converted = qw.convert_pt2e(gm)
    assert_names(caught, "convert_pt2e", "no observers", "not prepared")
    assert torch.equal(converted(X), gm(X))
    assert before.differences(gm) == []


def test_converting_a_symbolically_traced_model_warns_that_it_was_not_prepared():
    traced = torch.fx.symbolic_trace(Net().eval())
    before = Snapshot.of(traced)
    with pytest.warns(qw.MisuseWarning) as caught:
        qw.convert_pt2e(traced)
    assert_names(caught, "no observers", "not prepared", "prepare_pt2e")
    assert before.differences(traced) == []


def test_a_prepared_model_whose_quantizer_annotated_nothing_converts_without_a_warning():
    """Nothing to quantize is the quantizer's choice (annotation_report says why), not misuse."""

    class Nothing(qw.Quantizer):
        def annotate(self, model):
            return model

    prepared = qw.prepare_pt2e(_exported(), Nothing())
    before = Snapshot.of(prepared)
    with warnings.catch_warnings():
        warnings.simplefilter("error", qw.MisuseWarning)
        converted = qw.convert_pt2e(prepared)
    assert torch.equal(converted(X), prepared(X))
    assert before.differences(prepared) == []

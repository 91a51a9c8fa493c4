"""Bad input at prepare (issue #20): specs that do not fit the tensor they meet, observers
built from them that would fail in calibration, and calls that cannot be meant or would do
nothing. Each case asserts the exception (or warning) class, that the message names the
offending edge / node, quantizer, field and value (or the object misused), and that the
caller's model is bit-identical afterwards (tests.helpers.Snapshot)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx import GraphModule

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map
from quantweave.observers import (
    FakeQuantize,
    MinMaxObserver,
    PerChannelMinMaxObserver,
    PerGroupMinMaxObserver,
)
from tests.helpers import CONV_LINEAR_SUM_INPUT, FnQuantizer, assert_names
from tests.helpers import ConvLinearSumCaller as Caller
from tests.helpers import annotate_on as _on
from tests.helpers import node_of as _node

aten = torch.ops.aten


def _spec(**fields: Any) -> qw.QuantizationSpec:
    return qw.QuantizationSpec(**{"dtype": torch.int8, "observer_or_fake_quant_ctr": MinMaxObserver, **fields})


def _bypassing_validation(spec: Any, **fields: Any) -> Any:
    """A spec whose fields were set after construction (its own validation never saw them:
    what a spec object translated from another library, or built with relaxed checks, may hold)."""
    for name, value in fields.items():
        object.__setattr__(spec, name, value)
    return spec


def _per_channel(ch_axis: int | None, ctr: Any = PerChannelMinMaxObserver) -> qw.QuantizationSpec:
    spec = _spec(observer_or_fake_quant_ctr=ctr, qscheme=torch.per_channel_symmetric, ch_axis=ch_axis or 0)
    return _bypassing_validation(spec, ch_axis=ch_axis)  # ch_axis=None: the observer's default (issue #29)


def _grouped(group_size: int) -> qw.QuantizationSpec:
    return _spec(
        observer_or_fake_quant_ctr=PerGroupMinMaxObserver,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        group_size=group_size,
    )


def _shared_bias_with_weight_axis_1(gm: GraphModule) -> None:
    conv = _node(gm, aten.conv2d.default)
    weight, bias = conv.args[1], conv.args[2]
    annotate_input_qspec_map(conv, weight, _per_channel(1))
    annotate_input_qspec_map(conv, bias, qw.SharedQuantizationSpec((weight, conv)))


def _derived_bias_axis_1(gm: GraphModule) -> None:
    linear = _node(gm, aten.linear.default)
    annotate_input_qspec_map(linear, linear.args[0], _spec())

    def derive(observers: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ones(6), torch.zeros(6, dtype=torch.int32)

    derived = qw.DerivedQuantizationSpec(
        [(linear.args[0], linear)], derive, torch.int32, qscheme=torch.per_channel_symmetric, ch_axis=1
    )
    annotate_input_qspec_map(linear, linear.args[2], derived)


conv, linear, total = aten.conv2d.default, aten.linear.default, aten.sum.default

#: (case, annotate, regex the AnnotationError must match: edge or node, quantizer, field=value, allowed)
SPEC_ERRORS = [
    (
        "ch_axis beyond the weight's dimensions",
        _on(conv, 1, _per_channel(4)),
        r"edge 'conv_weight' -> 'conv2d'.*'corpus'.*QuantizationSpec\.ch_axis=4.*-4 to 3.*\(4, 3, 3, 3\)",
    ),
    ("negative ch_axis beyond", _on(conv, 1, _per_channel(-5)), r"'conv_weight' -> 'conv2d'.*ch_axis=-5.*-4 to 3"),
    ("ch_axis 1 of a 1-D bias", _on(linear, 2, _per_channel(1)), r"'linear_bias' -> 'linear'.*ch_axis=1.*-1 to 0"),
    (
        "per-channel on a 0-d tensor (ch_axis None: the default 0)",
        _on(total, "out", _per_channel(None)),
        r"output of 'sum_1'.*ch_axis=None.*default, 0.*per-tensor qscheme.*0-d",
    ),
    (
        "ch_axis set by the observer constructor",
        _on(conv, 1, _per_channel(None, PerChannelMinMaxObserver.with_args(ch_axis=5))),
        r"'conv_weight' -> 'conv2d'.*'corpus'.*PerChannelMinMaxObserver.*ch_axis=5.*-4 to 3",
    ),
    (
        "ch_axis that is not an int",
        _on(conv, 1, _bypassing_validation(_per_channel(0), ch_axis="0")),
        r"'conv_weight' -> 'conv2d'.*ch_axis='0'.*an int",
    ),
    ("group_size on a 4-D weight", _on(conv, 1, _grouped(3)), r"'conv_weight' -> 'conv2d'.*group_size=3.*2-D"),
    (
        "group_size not dividing the rows",
        _on(linear, 1, _grouped(3)),
        r"'linear_weight' -> 'linear'.*group_size=3.*divisor.*row length 4",
    ),
    (
        "quant_max beyond the dtype",
        _on(linear, 0, _bypassing_validation(_spec(), quant_max=300)),
        r"edge 'mean' -> 'linear'.*quant_max=300.*\[-128, 127\].*torch\.int8",
    ),
    (
        "quant_min above quant_max",
        _on(linear, 0, _bypassing_validation(_spec(), quant_min=10, quant_max=5)),
        r"'mean' -> 'linear'.*quant_min=10.*quant_min <= quant_max",
    ),
    (
        "dtype that is not a torch.dtype",
        _on(linear, 0, _bypassing_validation(_spec(), dtype="int8")),
        r"'mean' -> 'linear'.*dtype='int8'.*torch\.dtype",
    ),
    (
        "unknown qscheme",
        _on(linear, 0, _bypassing_validation(_spec(), qscheme="affine")),
        r"'mean' -> 'linear'.*qscheme='affine'.*per_tensor_affine",
    ),
    (
        "dynamic per-channel",
        _on(linear, 0, _bypassing_validation(_spec(is_dynamic=True), qscheme=torch.per_channel_affine, ch_axis=0)),
        r"'mean' -> 'linear'.*qscheme=torch\.per_channel_affine.*per-tensor",
    ),
    (
        "fixed zero point beyond the range",
        _on(linear, "out", _bypassing_validation(qw.FixedQParamsQuantizationSpec(torch.uint8, 0.1, 0), zero_point=300)),
        r"output of 'linear'.*FixedQParamsQuantizationSpec\.zero_point=300.*\[0, 255\]",
    ),
    (
        "shared spec whose axis the sharing tensor lacks",
        _shared_bias_with_weight_axis_1,
        r"edge 'conv_bias' -> 'conv2d'.*ch_axis=1.*edge 'conv_weight' -> 'conv2d'.*shares.*-1 to 0",
    ),
    ("derived spec with an axis beyond", _derived_bias_axis_1, r"'linear_bias' -> 'linear'.*Derived.*ch_axis=1"),
]


@pytest.mark.parametrize(("case", "annotate", "message"), SPEC_ERRORS, ids=[c[0] for c in SPEC_ERRORS])
def test_a_spec_that_does_not_fit_its_tensor_raises_naming_edge_quantizer_field_and_value(case, annotate, message):
    caller = Caller()
    with pytest.raises(qw.AnnotationError, match=message) as info:
        qw.prepare_pt2e(caller.gm, FnQuantizer(annotate))
    assert type(info.value) is qw.AnnotationError, case
    assert caller.untouched()


def test_specs_of_non_integer_dtypes_are_not_range_checked_and_ch_axis_none_is_the_default():
    """torchao-style placeholder dtypes (float8) are not held to an integer range, and a
    per-channel spec with ch_axis=None takes the observer's default (0) without error."""
    caller = Caller()

    def annotate(gm: GraphModule) -> None:
        _on(linear, 0, _bypassing_validation(_spec(), dtype=torch.float8_e4m3fn))(gm)
        _on(conv, 1, _per_channel(None))(gm)

    prepared = qw.prepare_pt2e(caller.gm, FnQuantizer(annotate))
    observers = [m for m in prepared.modules() if isinstance(m, PerChannelMinMaxObserver)]
    assert [o.ch_axis for o in observers] == [0]
    assert caller.untouched()


def test_a_good_spec_on_every_axis_prepares():
    for axis in (-4, -1, 0, 3):
        caller = Caller()
        prepared = qw.prepare_pt2e(caller.gm, FnQuantizer(_on(conv, 1, _per_channel(axis))))
        prepared(CONV_LINEAR_SUM_INPUT)
        qw.convert_pt2e(prepared)
        assert caller.untouched()


# -- calls that cannot be meant, or would do nothing -----------------------------------------


def test_qat_with_some_plain_observers_warns_naming_the_edge():
    caller = Caller(train=True)
    fake = _spec(observer_or_fake_quant_ctr=FakeQuantize.with_args(observer=MinMaxObserver))

    def annotate(gm: GraphModule) -> None:
        _on(linear, 0, fake)(gm)
        _on(conv, 0, _spec())(gm)

    with pytest.warns(qw.MisuseWarning) as caught:
        prepared = qw.prepare_qat_pt2e(caller.gm, FnQuantizer(annotate))
    assert_names(caught, "'corpus'", "MinMaxObserver")
    assert isinstance(prepared, GraphModule)
    assert caller.untouched()

"""Bad input at prepare with a real quantizer (x86): moved from tests/core/test_bad_prepare.py so that
tests/core runs without plugins."""

from __future__ import annotations

import warnings

import pytest
import torch

import quantweave as qw
from quantweave.observers import (
    FakeQuantize,
    FakeQuantizeBase,
    FixedQParamsFakeQuantize,
)
from tests.helpers import ConvLinearSum, ConvLinearSumCaller, FnQuantizer, Snapshot, annotate_on, assert_names

linear = torch.ops.aten.linear.default


def test_a_symbolically_traced_graph_module_raises_saying_to_export():
    traced = torch.fx.symbolic_trace(ConvLinearSum().eval())
    before = Snapshot.of(traced)
    with pytest.raises(ValueError) as info:
        qw.prepare_pt2e(traced, qw.get_quantizer("x86"))
    assert_names(info, "prepare_pt2e", "torch.export", "symbolic_trace")
    assert "torch.export.export(model, args).module()" in str(info.value)
    assert before.differences(traced) == []


def test_preparing_a_prepared_model_raises_naming_an_observer():
    caller = ConvLinearSumCaller()
    prepared = qw.prepare_pt2e(caller.gm, qw.get_quantizer("x86"))
    before = Snapshot.of(prepared)
    for prepare in (qw.prepare_pt2e, qw.prepare_qat_pt2e):
        with pytest.raises(ValueError) as info:
            prepare(prepared, qw.get_quantizer("x86"))
        assert_names(info, "already prepared", "4 observer(s)", "activation_post_process_", "'conv")
    assert before.differences(prepared) == []
    assert caller.untouched()


@pytest.mark.parametrize("api", [qw.prepare_pt2e, qw.prepare_qat_pt2e], ids=["prepare_pt2e", "prepare_qat_pt2e"])
def test_a_quantizer_class_instead_of_an_instance_raises_saying_so(api):
    from quantweave_x86 import X86InductorQuantizer

    caller = ConvLinearSumCaller()
    with pytest.raises(TypeError) as info:
        api(caller.gm, X86InductorQuantizer)
    assert_names(info, "X86InductorQuantizer", "class", "X86InductorQuantizer()")
    assert caller.untouched()


def test_qat_with_a_post_training_quantizer_raises_naming_the_quantizer_and_an_edge():
    caller = ConvLinearSumCaller(train=True)
    with pytest.raises(qw.AnnotationError) as info:
        qw.prepare_qat_pt2e(caller.gm, qw.get_quantizer("x86"))
    assert_names(info, "prepare_qat_pt2e", "'x86'", "plain observers", "edge '")
    assert caller.untouched()


def test_prepare_pt2e_with_fake_quantizers_warns_naming_the_quantizer():
    caller = ConvLinearSumCaller()
    with pytest.warns(qw.MisuseWarning) as caught:
        qw.prepare_pt2e(caller.gm, qw.get_quantizer("x86", is_qat=True))
    assert_names(caught, "prepare_pt2e", "'x86'", "fake-quantizers", "prepare_qat")
    assert caller.untouched()


def test_ptq_and_qat_with_matching_quantizers_do_not_warn():
    fixed = qw.FixedQParamsQuantizationSpec(torch.uint8, 1 / 256, 0)  # a FixedQParamsFakeQuantize in QAT
    with warnings.catch_warnings():
        warnings.simplefilter("error", qw.MisuseWarning)
        ptq = qw.prepare_pt2e(ConvLinearSumCaller().gm, qw.get_quantizer("x86"))
        qat = qw.prepare_qat_pt2e(ConvLinearSumCaller(train=True).gm, qw.get_quantizer("x86", is_qat=True))
        fixed_qat = qw.prepare_qat_pt2e(
            ConvLinearSumCaller(train=True).gm, FnQuantizer(annotate_on(linear, "out", fixed))
        )
    assert not any(isinstance(m, FakeQuantize) for m in ptq.modules())
    assert any(isinstance(m, FakeQuantizeBase) for m in qat.modules())
    assert any(isinstance(m, FixedQParamsFakeQuantize) for m in fixed_qat.modules())

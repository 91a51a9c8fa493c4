"""The conformance kit catches quantizers whose declarations are not the truth."""

import pytest
import torch

import quantweave as qw
from quantweave.capabilities import PATTERNS, Capability, TensorQuant
from quantweave.observers import MinMaxObserver, PerChannelMinMaxObserver
from quantweave.registry import QuantizerInfo
from quantweave.testing.conformance import PROBES, assert_conforms, check_capability, check_conformance

aten = torch.ops.aten
ACT = TensorQuant("uint8", 0, 255)
W = TensorQuant("int8", -128, 127, "per_channel", symmetric=True)


def act_spec(dtype=torch.uint8):
    return qw.QuantizationSpec(dtype=dtype, observer_or_fake_quant_ctr=MinMaxObserver, qscheme=torch.per_tensor_affine)


WEIGHT = qw.QuantizationSpec(
    dtype=torch.int8,
    qscheme=torch.per_channel_symmetric,
    ch_axis=0,
    observer_or_fake_quant_ctr=PerChannelMinMaxObserver,
)


class LinearQuantizer(qw.Quantizer):
    """Annotates linear; optionally also add (undeclared) or with the wrong act dtype."""

    def __init__(self, act_dtype=torch.uint8, also_add=False, skip_linear=False):
        self.act = act_spec(act_dtype)
        self.also_add, self.skip_linear = also_add, skip_linear

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.target == aten.linear.default and not self.skip_linear:
                qw.annotate_input_qspec_map(node, node.args[0], self.act)
                qw.annotate_input_qspec_map(node, node.args[1], WEIGHT)
                qw.annotate_output_qspec(node, self.act)
            elif node.target == aten.add.Tensor and self.also_add:
                for arg in node.args[:2]:
                    qw.annotate_input_qspec_map(node, arg, self.act)
        return model


def info(**options):
    return QuantizerInfo("lin", lambda: LinearQuantizer(**options), (Capability("linear", "static", ACT, W),))


def test_every_vocabulary_pattern_has_a_probe_containing_its_ops():
    assert set(PROBES) == set(PATTERNS)
    for pattern, factory in PROBES.items():
        model, inputs = factory()
        gm = torch.export.export(model.eval(), inputs).module()
        targets = {str(n.target) for n in gm.graph.nodes}
        assert PATTERNS[pattern][1][0] in targets, pattern


def test_a_truthful_quantizer_conforms():
    assert_conforms(info())


def test_declared_but_not_delivered_is_reported():
    (failure,) = check_capability(info(skip_linear=True), info().capabilities[0])
    assert "'linear' (aten.linear.default) is not annotated" in str(failure)


def test_wrong_dtype_is_reported():
    failures = check_capability(info(act_dtype=torch.int8), info().capabilities[0])
    assert any(
        "activation input 'inputs_0' of 'linear': declared uint8[0,255] per_tensor affine, "
        "annotated int8[-128,127] per_tensor affine" in str(f)
        for f in failures
    )


def test_annotating_without_declaring_is_reported():
    failures = check_conformance(info(also_add=True))
    messages = [str(f) for f in failures]
    assert any("lin [add, static]: annotates 'add' (aten.add.Tensor)" in m for m in messages), messages
    with pytest.raises(AssertionError, match=r"conformance failure\(s\)"):
        assert_conforms(info(also_add=True))


def test_a_quantizer_declaring_nothing_fails():
    empty = QuantizerInfo("empty", LinearQuantizer, ())
    assert [f.message for f in check_conformance(empty) if f.pattern == "-"] == ["declares no capabilities"]

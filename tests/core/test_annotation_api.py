"""The annotation API validates itself on construction, with messages that name the field."""

import pytest
import torch

import quantweave as qw
from quantweave.observers import MinMaxObserver, PerChannelMinMaxObserver


def spec(**kw):
    args = dict(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver, qscheme=torch.per_tensor_affine)
    args.update(kw)
    return qw.QuantizationSpec(**args)


def test_quantization_spec_fields_and_defaults():
    s = spec(quant_min=-8, quant_max=7)
    assert (s.dtype, s.quant_min, s.quant_max, s.is_dynamic, s.ch_axis) == (torch.int8, -8, 7, False, None)
    assert s == spec(quant_min=-8, quant_max=7) and hash(s) == hash(spec(quant_min=-8, quant_max=7))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quant_min": 5, "quant_max": 4}, r"expected quant_min <= quant_max; got quant_min=5, quant_max=4"),
        ({"quant_min": -129}, r"quant_min=-129 is outside the range of torch.int8 \[-128, 127\]"),
        ({"dtype": torch.uint8, "quant_max": 256}, r"quant_max=256 is outside the range of torch.uint8"),
        ({"dtype": torch.float64}, r"dtype must be one of .*got torch.float64"),
        ({"dtype": torch.float32, "is_dynamic": True}, r"needs an integer dtype .*got dtype=torch.float32"),
        ({"dtype": torch.float8_e4m3fn, "quant_max": 1000}, r"quant_max=1000 is outside the finite range"),
        ({"qscheme": torch.per_channel_symmetric, "ch_axis": 1.0}, r"ch_axis must be an int or None; got 1.0"),
        ({"observer_or_fake_quant_ctr": 3}, r"observer_or_fake_quant_ctr must be callable"),
        ({"quant_min": 1.5}, r"quant_min must be an int or None; got 1.5"),
        (
            {"is_dynamic": True, "qscheme": torch.per_channel_affine, "ch_axis": 0},
            r"dynamic quantization supports per-tensor qschemes only",
        ),
    ],
)
def test_quantization_spec_rejects_bad_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        spec(**kwargs)


def test_fixed_qparams_spec_validation():
    ok = qw.FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=1 / 256, zero_point=0, quant_min=0, quant_max=255)
    assert ok.scale == 1 / 256
    with pytest.raises(ValueError, match=r"scale must be a positive number; got 0"):
        qw.FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=0, zero_point=0)
    with pytest.raises(ValueError, match=r"zero_point=300 is outside \[quant_min, quant_max\] = \[0, 255\]"):
        qw.FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=0.1, zero_point=300)


def test_shared_and_derived_specs_validate_references():
    with pytest.raises(ValueError, match=r"SharedQuantizationSpec: expected a torch.fx.Node or an input edge"):
        qw.SharedQuantizationSpec("conv")
    with pytest.raises(ValueError, match=r"derived_from must be a non-empty list"):
        qw.DerivedQuantizationSpec(derived_from=[], derive_qparams_fn=lambda obs: obs, dtype=torch.int32)


def test_config_helpers_return_the_right_spec():
    act = spec()
    weight = spec(qscheme=torch.per_channel_symmetric, ch_axis=0, observer_or_fake_quant_ctr=PerChannelMinMaxObserver)
    config = qw.QuantizationConfig(act, act, weight, None)
    assert qw.get_input_act_qspec(config) is act
    assert qw.get_output_act_qspec(config) is act
    assert qw.get_weight_qspec(config) is weight
    assert qw.get_bias_qspec(config) is None
    assert qw.get_input_act_qspec(None) is None
    bad = qw.QuantizationConfig(weight, None, None, None)
    with pytest.raises(ValueError, match=r"input activation spec must be per-tensor"):
        qw.get_input_act_qspec(bad)


def test_annotate_helpers_write_annotations_and_reject_non_inputs():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x) + y

    gm = torch.export.export(M(), (torch.randn(2), torch.randn(2))).module()
    relu = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.relu.default)
    add = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.add.Tensor)
    qw.annotate_input_qspec_map(add, relu, spec())
    qw.annotate_output_qspec(add, spec())
    annotation = add.meta["quantization_annotation"]
    assert annotation.input_qspec_map == {relu: spec()} and annotation.output_qspec == spec()
    assert not qw.is_annotated(add)
    annotation._annotated = True
    assert qw.is_annotated([relu, add])
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with pytest.raises(ValueError, match=r"node 'add': 'x' is not one of its inputs"):
        qw.annotate_input_qspec_map(add, x, spec())

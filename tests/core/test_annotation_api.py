"""The annotation API validates itself on construction, with messages that name the field."""

import pytest
import torch

import quantweave as qw
from quantweave.authoring import (
    annotate_input_qspec_map,
    annotate_output_qspec,
    get_bias_qspec,
    get_input_act_qspec,
    get_output_act_qspec,
    get_weight_qspec,
)
from quantweave.observers import MinMaxObserver, PerChannelMinMaxObserver
from quantweave.plugin_api import is_annotated
from tests.helpers import assert_names


def spec(**kw):
    args = dict(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver, qscheme=torch.per_tensor_affine)
    args.update(kw)
    return qw.QuantizationSpec(**args)


def test_quantization_spec_fields_and_defaults():
    s = spec(quant_min=-8, quant_max=7)
    assert (s.dtype, s.quant_min, s.quant_max, s.is_dynamic, s.ch_axis) == (torch.int8, -8, 7, False, None)
    assert s == spec(quant_min=-8, quant_max=7) and hash(s) == hash(spec(quant_min=-8, quant_max=7))


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"quant_min": 5, "quant_max": 4}, ("quant_min <= quant_max", "quant_min=5", "quant_max=4")),
        ({"quant_min": -129}, ("quant_min=-129", "torch.int8", "[-128, 127]")),
        ({"dtype": torch.uint8, "quant_max": 256}, ("quant_max=256", "torch.uint8")),
        ({"dtype": torch.float64}, ("dtype", "torch.float64")),
        ({"dtype": torch.float32, "is_dynamic": True}, ("integer dtype", "dtype=torch.float32")),
        ({"dtype": torch.float8_e4m3fn, "quant_max": 1000}, ("quant_max=1000", "finite range")),
        ({"qscheme": torch.per_channel_symmetric, "ch_axis": 1.0}, ("ch_axis", "int or None", "1.0")),
        ({"observer_or_fake_quant_ctr": 3}, ("observer_or_fake_quant_ctr", "callable")),
        ({"quant_min": 1.5}, ("quant_min", "int or None", "1.5")),
        (
            {"is_dynamic": True, "qscheme": torch.per_channel_affine, "ch_axis": 0},
            ("dynamic", "per-tensor"),
        ),
    ],
)
def test_quantization_spec_rejects_bad_fields(kwargs, names):
    with pytest.raises(ValueError) as info:
        spec(**kwargs)
    assert_names(info, *names)


def test_fixed_qparams_spec_validation():
    ok = qw.FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=1 / 256, zero_point=0, quant_min=0, quant_max=255)
    assert ok.scale == 1 / 256
    with pytest.raises(ValueError) as info:
        qw.FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=0, zero_point=0)
    assert_names(info, "scale", "positive", "got 0")
    with pytest.raises(ValueError) as info:
        qw.FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=0.1, zero_point=300)
    assert_names(info, "zero_point=300", "[0, 255]")


def test_shared_and_derived_specs_validate_references():
    with pytest.raises(ValueError) as info:
        qw.SharedQuantizationSpec("conv")
    assert_names(info, "SharedQuantizationSpec", "torch.fx.Node", "input edge")
    with pytest.raises(ValueError) as info:
        qw.DerivedQuantizationSpec(derived_from=[], derive_qparams_fn=lambda obs: obs, dtype=torch.int32)
    assert_names(info, "derived_from", "non-empty")


def test_config_helpers_return_the_right_spec():
    act = spec()
    weight = spec(qscheme=torch.per_channel_symmetric, ch_axis=0, observer_or_fake_quant_ctr=PerChannelMinMaxObserver)
    config = qw.QuantizationConfig(act, act, weight, None)
    assert get_input_act_qspec(config) is act
    assert get_output_act_qspec(config) is act
    assert get_weight_qspec(config) is weight
    assert get_bias_qspec(config) is None
    assert get_input_act_qspec(None) is None
    bad = qw.QuantizationConfig(weight, None, None, None)
    with pytest.raises(ValueError) as info:
        get_input_act_qspec(bad)
    assert_names(info, "input activation", "per-tensor")


def test_annotate_helpers_write_annotations_and_reject_non_inputs():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x) + y

    gm = torch.export.export(M(), (torch.randn(2), torch.randn(2))).module()
    relu = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.relu.default)
    add = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.add.Tensor)
    annotate_input_qspec_map(add, relu, spec())
    annotate_output_qspec(add, spec())
    annotation = add.meta["quantization_annotation"]
    assert annotation.input_qspec_map == {relu: spec()} and annotation.output_qspec == spec()
    assert not is_annotated(add)
    annotation._annotated = True
    assert is_annotated([relu, add])
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with pytest.raises(ValueError) as info:
        annotate_input_qspec_map(add, x, spec())
    assert_names(info, "'add'", "'x'", "not one of its inputs")

"""Group-wise quantization in the core: ``QuantizationSpec(group_size=...)``, the per-group
observer, observer sharing, convert (``quantize/dequantize_per_channel_group``), the
``per_group`` granularity of ``TensorQuant`` and what the conformance kit checks about it."""

import dataclasses
import json

import pytest
import torch
from torch import nn

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, dequantize_ops
from quantweave.capabilities import tensor_quant_from_spec
from quantweave.observers import PerChannelMinMaxObserver, PerGroupMinMaxObserver, is_calibrated
from quantweave.plugin_api import Capability, Mode, QuantizerInfo, TensorQuant, mark_annotated
from quantweave.testing.conformance import check_capability
from tests.helpers import assert_names

dequantize_ops()  # registers torch.ops.quantized_decomposed
qd = torch.ops.quantized_decomposed
aten = torch.ops.aten


def group_spec(group_size=32, qmin=-8, qmax=7, qscheme=torch.per_channel_symmetric, ctr=PerGroupMinMaxObserver):
    return qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=qmin,
        quant_max=qmax,
        qscheme=qscheme,
        ch_axis=0,
        group_size=group_size,
        observer_or_fake_quant_ctr=ctr,
    )


class WeightQuantizer(qw.Quantizer):
    """Annotates the weight of every embedding and linear with ``spec`` (weight-only)."""

    def __init__(self, spec, targets=(aten.embedding.default, aten.linear.default)):
        self.spec, self.targets = spec, targets

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.op == "call_function" and node.target in self.targets:
                weight = node.args[0] if node.target == aten.embedding.default else node.args[1]
                annotate_input_qspec_map(node, weight, self.spec)
                mark_annotated(node)
        return model


class TableAndHead(nn.Module):
    def __init__(self, tied=False):
        super().__init__()
        self.emb = nn.Embedding(24, 64)
        self.head = nn.Linear(64, 24, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, tokens):
        return self.head(self.emb(tokens))


def _quantize(model, quantizer, fold=True):
    tokens = torch.tensor([[1, 5, 7, 23]])
    prepared = qw.prepare_pt2e(torch.export.export(model.eval(), (tokens,)).module(), quantizer)
    prepared(tokens)
    return qw.convert_pt2e(prepared, fold_quantize=fold), tokens


def _reference(weight, group_size, qmin, qmax, symmetric):
    groups = weight.reshape(weight.shape[0], -1, group_size)
    lo, hi = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
    if symmetric:
        scale = (torch.maximum(-lo, hi) / ((qmax - qmin) / 2)).clamp(min=torch.finfo(torch.float32).eps)
        zp = torch.zeros_like(scale, dtype=torch.int32)
    else:
        scale = ((hi - lo) / (qmax - qmin)).clamp(min=torch.finfo(torch.float32).eps)
        zp = (qmin - torch.round(lo / scale)).clamp(qmin, qmax).to(torch.int32)
    q = qd.quantize_per_channel_group(weight, scale, zp, qmin, qmax, torch.int8, group_size)
    return q, scale, zp


# -- the spec -----------------------------------------------------------------------------------


def test_group_size_defaults_to_none_so_pt2e_specs_are_unchanged():
    spec = qw.QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=PerChannelMinMaxObserver)
    assert spec.group_size is None
    assert [f.name for f in dataclasses.fields(qw.QuantizationSpec)][-2:] == ["group_size", "per_token"]
    assert group_spec(32) != group_spec(64) and group_spec(32) == group_spec(32)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"group_size": 1}, ("group_size", "int >= 2")),
        ({"group_size": True}, ("group_size", "int >= 2", "True")),
        (
            {"qscheme": torch.per_tensor_symmetric},
            ("group_size=32", "per_channel_symmetric or torch.per_channel_affine", "torch.per_tensor_symmetric"),
        ),
        (
            {"qscheme": torch.per_channel_affine_float_qparams},
            ("group_size=32", "per_channel_symmetric or torch.per_channel_affine", "per_channel_affine_float_qparams"),
        ),
        ({"ch_axis": 1}, ("ch_axis", "must be 0", "ch_axis=1")),
    ],
)
def test_group_spec_validation_says_what_is_wrong(kwargs, names):
    fields = {
        "dtype": torch.int8,
        "quant_min": -8,
        "quant_max": 7,
        "qscheme": torch.per_channel_symmetric,
        "ch_axis": 0,
        "group_size": 32,
        "observer_or_fake_quant_ctr": PerGroupMinMaxObserver,
    }
    with pytest.raises(ValueError) as info:
        qw.QuantizationSpec(**{**fields, **kwargs})
    assert_names(info, "QuantizationSpec", *names)


def test_group_spec_cannot_be_dynamic():
    with pytest.raises(ValueError) as info:
        dataclasses.replace(group_spec(), is_dynamic=True)
    assert_names(info, "group-wise", "static", "is_dynamic=True")


# -- the observer -------------------------------------------------------------------------------


@pytest.mark.parametrize("symmetric", [True, False])
def test_observer_qparams_per_row_and_group(symmetric):
    weight = torch.randn(6, 64)
    qscheme = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
    obs = PerGroupMinMaxObserver(group_size=16, dtype=torch.int8, qscheme=qscheme, quant_min=-8, quant_max=7)
    assert not is_calibrated(obs)
    obs(weight[:, :])
    assert is_calibrated(obs)
    scale, zp = obs.calculate_qparams()
    assert scale.shape == zp.shape == (6, 4) and scale.dtype == torch.float32 and zp.dtype == torch.int32
    _, ref_scale, ref_zp = _reference(weight, 16, -8, 7, symmetric)
    torch.testing.assert_close(scale, ref_scale)
    assert torch.equal(zp, ref_zp)


def _symmetric_scales_as_torch_computes_them(min_val, max_val, qmin, qmax, eps):
    """torch's symmetric per-channel expressions: max(|min(min, 0)|, max(max, 0)) / ((qmax - qmin) / 2),
    at least eps."""
    amax = torch.maximum(-torch.clamp(min_val, max=0.0), torch.clamp(max_val, min=0.0))
    return torch.clamp(amax / ((qmax - qmin) / 2), min=eps).to(torch.float32)


@pytest.mark.parametrize(
    ("qmin", "qmax", "dtype"), [(-8, 7, torch.int8), (-128, 127, torch.int8), (0, 15, torch.uint8)]
)
@pytest.mark.parametrize("eps", [float(torch.finfo(torch.float32).eps), 2.0**-12, 1e-30])
def test_symmetric_scales_are_torchs_bit_for_bit(qmin, qmax, dtype, eps):
    """On every kind of min / max a state can hold -- observed ranges, zeros of both signs, tiny and
    huge values, infinities, NaN, and a minimum above the maximum (a state set by hand) -- the
    symmetric scales are the float32 bits of torch's expressions, and the zero points the middle."""
    torch.manual_seed(0)
    special = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-38, 3e38, -3e38, float("inf"), float("-inf"), float("nan")])
    lows = torch.cat([-torch.rand(200) * 10 ** torch.randint(-40, 38, (200,)).float(), special, torch.rand(20)])
    highs = torch.cat([torch.rand(200) * 10 ** torch.randint(-40, 38, (200,)).float(), special, -torch.rand(20)])
    min_val, max_val = torch.meshgrid(lows, highs, indexing="ij")
    obs = PerGroupMinMaxObserver(group_size=2, dtype=dtype, quant_min=qmin, quant_max=qmax, eps=eps)
    obs.min_val, obs.max_val = min_val.reshape(-1, 4).clone(), max_val.reshape(-1, 4).clone()
    scale, zero_point = obs.calculate_qparams()
    expected = _symmetric_scales_as_torch_computes_them(obs.min_val, obs.max_val, qmin, qmax, eps)
    assert scale.dtype == torch.float32 and torch.equal(scale.view(torch.int32), expected.view(torch.int32))
    middle = 0 if dtype == torch.int8 else (qmin + qmax + 1) // 2
    assert zero_point.dtype == torch.int32 and bool((zero_point == middle).all())
    for state, given in ((obs.min_val, min_val), (obs.max_val, max_val)):  # left as it was (bits: NaN included)
        assert torch.equal(state.view(torch.int32), given.reshape(-1, 4).view(torch.int32))


def test_observer_keeps_running_min_max():
    obs = PerGroupMinMaxObserver(group_size=2)
    obs(torch.tensor([[1.0, -1.0, 0.5, 0.5]]))
    obs(torch.tensor([[3.0, 0.0, 0.0, -2.0]]))
    assert obs.min_val.tolist() == [[-1.0, -2.0]] and obs.max_val.tolist() == [[3.0, 0.5]]


def test_observer_rejects_what_it_cannot_group():
    with pytest.raises(ValueError, match="2-D"):
        PerGroupMinMaxObserver(group_size=4)(torch.randn(2, 3, 4))
    with pytest.raises(ValueError) as info:
        PerGroupMinMaxObserver(group_size=4)(torch.randn(2, 6))
    assert_names(info, "PerGroupMinMaxObserver", "rows of 6", "groups of 4")
    with pytest.raises(ValueError, match=r"per_channel_symmetric or torch\.per_channel_affine"):
        PerGroupMinMaxObserver(group_size=4, qscheme=torch.per_tensor_affine)
    with pytest.raises(ValueError, match="ch_axis=0"):
        PerGroupMinMaxObserver(group_size=4, ch_axis=1)


# -- prepare / convert --------------------------------------------------------------------------


@pytest.mark.parametrize("symmetric", [True, False])
def test_convert_stores_int8_groups_and_dequantizes_per_group(symmetric):
    torch.manual_seed(0)
    model = TableAndHead()
    qscheme = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
    converted, tokens = _quantize(model, WeightQuantizer(group_spec(32, qscheme=qscheme)))
    dqs = [n for n in converted.graph.nodes if n.target == qd.dequantize_per_channel_group.default]
    assert len(dqs) == 2  # the table and the head weight
    assert not any(n.target == qd.quantize_per_channel_group.default for n in converted.graph.nodes)  # folded
    for dq, weight in zip(dqs, (model.emb.weight, model.head.weight), strict=True):
        stored, scale, zp, qmin, qmax, dtype, group_size, out_dtype = dq.args
        assert (qmin, qmax, dtype, group_size, out_dtype) == (-8, 7, torch.int8, 32, torch.float32)
        values = getattr(converted, stored.target)
        ref_q, ref_scale, ref_zp = _reference(weight.detach(), 32, -8, 7, symmetric)
        assert values.dtype == torch.int8 and torch.equal(values, ref_q)
        torch.testing.assert_close(getattr(converted, scale.target), ref_scale)
        assert torch.equal(getattr(converted, zp.target), ref_zp)
    ref_w = [
        qd.dequantize_per_channel_group(
            *_reference(w.detach(), 32, -8, 7, symmetric), -8, 7, torch.int8, 32, torch.float32
        )
        for w in (model.emb.weight, model.head.weight)
    ]
    expected = torch.nn.functional.linear(torch.nn.functional.embedding(tokens, ref_w[0]), ref_w[1])
    torch.testing.assert_close(converted(tokens), expected)


def test_unfolded_groups_quantize_at_run_time_with_the_same_result():
    model = TableAndHead()
    folded, tokens = _quantize(model, WeightQuantizer(group_spec(16)))
    unfolded, _ = _quantize(model, WeightQuantizer(group_spec(16)), fold=False)
    assert sum(n.target == qd.quantize_per_channel_group.default for n in unfolded.graph.nodes) == 2
    torch.testing.assert_close(unfolded(tokens), folded(tokens))


def test_converted_group_model_exports_saves_and_loads(tmp_path):
    converted, tokens = _quantize(TableAndHead(), WeightQuantizer(group_spec(32)))
    exported = torch.export.export(converted, (tokens,))
    torch.export.save(exported, tmp_path / "m.pt2")
    loaded = torch.export.load(tmp_path / "m.pt2").module()
    assert torch.equal(loaded(tokens), converted(tokens))


def test_tied_weight_with_equal_group_specs_is_quantized_once():
    converted, _ = _quantize(TableAndHead(tied=True), WeightQuantizer(group_spec(32)))
    dqs = [n for n in converted.graph.nodes if n.target == qd.dequantize_per_channel_group.default]
    assert len(dqs) == 2 and len({n.args[0].target for n in dqs}) == 1  # one stored tensor, one dq per user


def test_group_and_per_channel_specs_on_one_tensor_do_not_share():
    per_channel = qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=-8,
        quant_max=7,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        observer_or_fake_quant_ctr=PerChannelMinMaxObserver,
    )

    class Mixed(qw.Quantizer):
        def annotate(self, model):
            WeightQuantizer(group_spec(32), (aten.embedding.default,)).annotate(model)
            WeightQuantizer(per_channel, (aten.linear.default,)).annotate(model)
            return model

    converted, _ = _quantize(TableAndHead(tied=True), Mixed())
    targets = {n.target for n in converted.graph.nodes if n.op == "call_function"}
    assert {qd.dequantize_per_channel_group.default, qd.dequantize_per_channel.default} <= targets


def test_a_group_spec_needs_an_observer_that_takes_group_size():
    with pytest.raises(qw.AnnotationError) as info:
        _quantize(TableAndHead(), WeightQuantizer(group_spec(32, ctr=PerChannelMinMaxObserver)))
    assert_names(info, "'emb_weight' -> 'embedding'", "could not build", "PerChannelMinMaxObserver", "'group_size'")
    assert_names(info, "group_size=32", "quantweave.observers.PerGroupMinMaxObserver")  # and the fix


# -- declarations -------------------------------------------------------------------------------


def test_tensor_quant_per_group_round_trips_and_reads_from_specs():
    tq = TensorQuant("int8", -8, 7, "per_group", symmetric=True, ch_axis=0, group_size=32)
    assert str(tq) == "int8[-8,7] per_group(32) axis 0 sym"
    assert tq.to_dict()["group_size"] == 32
    assert TensorQuant(**json.loads(json.dumps(tq.to_dict()))) == tq
    assert "group_size" not in TensorQuant("int8", -127, 127, "per_channel", True, 0).to_dict()  # API-1 JSON as before
    assert tensor_quant_from_spec(group_spec(32)) == tq
    assert tensor_quant_from_spec(dataclasses.replace(group_spec(32), qscheme=torch.per_channel_affine)) == (
        dataclasses.replace(tq, symmetric=False)
    )
    cap = Capability("embedding", Mode.WEIGHT_ONLY, weight=tq)
    assert Capability.from_dict(json.loads(json.dumps(cap.to_dict()))) == cap


@pytest.mark.parametrize(
    "kwargs", [{"granularity": "per_group"}, {"group_size": 32}, {"granularity": "per_group", "group_size": 1}]
)
def test_tensor_quant_group_size_goes_with_per_group(kwargs):
    with pytest.raises(ValueError, match="group_size"):
        TensorQuant("int8", -8, 7, **kwargs)


def _info(spec, declared):
    return QuantizerInfo(
        "grouped",
        lambda: WeightQuantizer(spec, (aten.embedding.default,)),
        (Capability("embedding", Mode.WEIGHT_ONLY, weight=declared),),
        mode_options={"weight_only": {}},
    )


DECLARED = TensorQuant("int8", -8, 7, "per_group", symmetric=True, ch_axis=0, group_size=32)


def test_kit_accepts_a_group_wise_declaration_it_can_verify():
    info = _info(group_spec(32), DECLARED)
    assert check_capability(info, info.capabilities[0]) == []


def test_kit_names_a_wrong_group_size():
    info = _info(group_spec(64), DECLARED)
    (failure,) = check_capability(info, info.capabilities[0])
    assert "per_group(32)" in failure.message and "per_group(64)" in failure.message


class _NotGrouping(PerChannelMinMaxObserver):
    """Takes group_size, but observes (and converts) per channel: what the kit must catch."""

    def __init__(self, group_size, **kwargs):
        super().__init__(**kwargs)


def test_kit_checks_the_converted_weight_is_stored_per_group():
    info = _info(group_spec(32, ctr=_NotGrouping), DECLARED)
    (failure,) = check_capability(info, info.capabilities[0])
    assert "not read through dequantize_per_channel_group" in failure.message
    assert "dequantize_per_channel" in failure.message

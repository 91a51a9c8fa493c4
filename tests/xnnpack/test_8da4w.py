"""8da4w through PT2E (issue #25): ``get_8da4w_config(group_size)`` annotates linears with int8
activations quantized per token at run time and int4 group-wise symmetric weights; convert
stores them as ``dequantize_per_channel_group`` of int8 values in [-8, 7] with bfloat16-valued
scales; ``to_executorch`` hands every linear to XNNPACK's blockwise 4-bit kernels, which store
the values packed two per byte.

The runtime tests (marker ``executorch``) share one lowered program of a small decoder LM
(module-scoped fixture); the last one lowers ExecuTorch's own 8da4w (torchao's ``quantize_``)
of the same model beside it."""

import pytest
import torch

import quantweave as qw
import quantweave_xnnpack as qx
from quantweave.plugin_api import ANNOTATION_KEY
from quantweave.testing.inspect import sqnr
from quantweave.testing.models import lm_prompts, tiny_decoder_lm

GROUP = 32
QD = torch.ops.quantized_decomposed


def _lm():
    return tiny_decoder_lm(vocab=96, dim=64, layers=1, heads=2, max_seq=16)


def _flow(model, quantizer, inputs):
    prepared = qw.prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
    prepared(*inputs)
    return prepared, qw.convert_pt2e(prepared)


@pytest.fixture(scope="module")
def lm_8da4w():
    model = _lm()
    inputs = (lm_prompts(model, 1),)
    quantizer = qx.XNNPACKQuantizer().set_global(qx.get_8da4w_config(GROUP))
    prepared, converted = _flow(model, quantizer, inputs)
    return model, inputs, prepared, converted


def _group_dqs(converted):
    return [n for n in converted.graph.nodes if n.target == QD.dequantize_per_channel_group.default]


def _attr(gm, node):
    return getattr(gm, node.target)


def test_every_linear_gets_dynamic_per_token_activations_and_int4_groups(lm_8da4w):
    model, _, prepared, converted = lm_8da4w
    linears = [n for n in prepared.graph.nodes if n.target == torch.ops.aten.linear.default]
    assert len(linears) == sum(isinstance(m, torch.nn.Linear) for m in model.modules()) == 5
    for node in linears:
        annotation = node.meta[ANNOTATION_KEY]
        act, weight = (annotation.input_qspec_map[a.args[0]] for a in node.args[:2])  # behind their observers
        assert act.is_dynamic and act.per_token and (act.quant_min, act.quant_max) == (-128, 127)
        assert weight.group_size == GROUP and (weight.quant_min, weight.quant_max) == (-8, 7)
        assert weight.qscheme == torch.per_channel_symmetric
    assert {row[2] for row in qx.linear_weights(prepared)} == {f"int4 group-wise ({GROUP})"}
    assert "blocks.0.qkv" in qx.linear_weights_text(prepared)
    assert converted.graph.find_nodes(op="call_function", target=QD.quantize_per_token.default)


def test_convert_stores_int4_values_with_bf16_scales_per_group(lm_8da4w):
    model, inputs, _, converted = lm_8da4w
    dqs = _group_dqs(converted)
    assert len(dqs) == 5
    for dq in dqs:
        values, scales, zero_points = (_attr(converted, a) for a in dq.args[:3])
        assert values.dtype == torch.int8 and int(values.min()) >= -8 and int(values.max()) <= 7
        assert scales.shape == (values.shape[0], values.shape[1] // GROUP) and dq.args[6] == GROUP
        assert torch.equal(scales.to(torch.bfloat16).to(torch.float32), scales)  # what XNNPACK stores
        assert not zero_points.any()
    # rounding the scales up never clips: every weight is within half a step of its value
    with torch.no_grad():
        assert sqnr(model(*inputs), converted(*inputs)) > 15


def test_scales_are_rounded_up_to_bfloat16():
    from quantweave_xnnpack._blockwise import round_up_to_bf16

    scale = torch.tensor([0.1, 1.0, 3.0e-3, 1.2345e-5])
    rounded = round_up_to_bf16(scale)
    assert torch.equal(rounded.to(torch.bfloat16).to(torch.float32), rounded)
    assert (rounded >= scale).all() and ((rounded - scale) / scale).max() <= 2**-7


def test_8bit_override_by_module_name_and_the_report_says_which_got_what():
    model = _lm()
    inputs = (lm_prompts(model, 1),)
    int8 = qx.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True, act_granularity="per_token")
    quantizer = (
        qx.XNNPACKQuantizer()
        .set_global(qx.get_8da4w_config(GROUP))
        .set_module_name("head", int8)
        .set_module_name("blocks.0.fc2", None)
    )
    prepared, converted = _flow(model, quantizer, inputs)
    forms = {layer: form for _, layer, form in qx.linear_weights(prepared)}
    assert forms["head"] == "int8 per-channel" and forms["blocks.0.qkv"] == f"int4 group-wise ({GROUP})"
    assert forms["blocks.0.fc2"].startswith("float") and "blocks.0.fc2" in forms["blocks.0.fc2"]
    assert len(_group_dqs(converted)) == 3


def test_convs_stay_float_under_a_groupwise_config_with_the_reason():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 32)).eval()
    inputs = (torch.randn(1, 3, 8, 8),)
    prepared, _ = _flow(model, qx.XNNPACKQuantizer().set_global(qx.get_8da4w_config(GROUP)), inputs)
    report = qw.annotation_report(prepared)
    rows = {r.op: r for r in report.nodes}
    assert rows["aten.linear.default"].status == "quantized"
    conv = rows["aten.conv2d.default"]
    assert conv.status == "float" and "group-wise" in conv.reason and "linear only" in conv.reason


def test_products_stay_float_under_a_groupwise_config_with_the_reason():
    """GPT-2's Conv1D (addmm of an [in, out] weight) and ``x @ W``: the groups run along rows of
    an [out, in] weight, so under 8da4w they stay float, each with a reason naming the op."""
    from tests.library_style import Conv1D

    model = torch.nn.Sequential(Conv1D(64, 64), torch.nn.Linear(64, 32)).eval()
    inputs = (torch.randn(2, 5, 64),)
    prepared, converted = _flow(model, qx.XNNPACKQuantizer().set_global(qx.get_8da4w_config(GROUP)), inputs)
    rows = {r.op: r for r in qw.annotation_report(prepared).nodes}
    assert rows["aten.linear.default"].status == "quantized"
    addmm = rows["aten.addmm.default"]
    assert addmm.status == "float" and "addmm" in addmm.reason and "group-wise" in addmm.reason
    assert sqnr(model(*inputs), converted(*inputs)) > 15


def test_declares_linear_only_per_group():
    caps = qx.XNNPACKQuantizer().set_global(qx.get_8da4w_config(64)).quantization_capabilities()
    assert [c.pattern for c in caps] == ["linear"]
    assert caps[0].weight.granularity == "per_group" and caps[0].weight.group_size == 64


def test_group_size_not_dividing_in_features_names_the_layer_and_option():
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 8)).eval()
    inputs = (torch.randn(2, 64),)
    exported = torch.export.export(model, inputs).module()
    with pytest.raises(qw.AnnotationError) as info:
        qw.prepare_pt2e(exported, qx.XNNPACKQuantizer().set_global(qx.get_8da4w_config(GROUP)))
    message = str(info.value)
    assert "'2'" in message and "weight_group_size=32" in message and "48" in message


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: qx.get_8da4w_config(48), ("group_size", "48")),
        (lambda: qx.get_8da4w_config(0), ("group_size",)),
        (lambda: qx.get_symmetric_quantization_config(is_per_channel=True, weight_group_size=32), ("is_dynamic",)),
        (
            lambda: qx.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True, weight_group_size=32),
            ("weight_qmin", "weight_qmax"),
        ),
    ],
)
def test_bad_options_name_the_option(call, names):
    with pytest.raises(ValueError) as info:
        call()
    assert all(name in str(info.value) for name in names), str(info.value)


# -- on the ExecuTorch runtime ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def lowered(lm_8da4w):
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e xnnpack)")
    _, inputs, _, converted = lm_8da4w
    return qx.to_executorch(converted, inputs)


@pytest.mark.executorch
def test_every_linear_is_delegated_to_the_blockwise_kernels(lowered):
    delegated = lowered.delegated
    assert delegated.get("aten.linear.default") == 5, lowered.summary()
    assert delegated.get("quantized_decomposed.dequantize_per_channel_group.default") == 5, lowered.summary()
    for op in ("choose_qparams_per_token_asymmetric", "quantize_per_token", "dequantize_per_token"):
        assert delegated.get(f"quantized_decomposed.{op}.default") == 5, lowered.summary()
    assert not any("quantize" in op or "linear" in op for op in lowered.not_delegated), lowered.summary()


@pytest.mark.executorch
def test_the_program_holds_the_weights_packed_two_per_byte(lm_8da4w, lowered):
    model, _, _, converted = lm_8da4w
    for dq in _group_dqs(converted):
        values, scales = _attr(converted, dq.args[0]), _attr(converted, dq.args[1])
        shifted = (values.to(torch.int16) + 8).to(torch.uint8).contiguous()
        packed = (shifted[:, 1::2] << 4) | shifted[:, 0::2]  # XNNPACK's qb4w layout: even element low
        assert packed.numpy().tobytes() in lowered.buffer
        assert values.numpy().tobytes() not in lowered.buffer  # not also stored one per byte
        assert scales.to(torch.bfloat16).view(torch.int16).numpy().tobytes() in lowered.buffer
    weights = sum(_attr(converted, dq.args[0]).numel() for dq in _group_dqs(converted))
    float_bytes = sum(4 * p.numel() for p in model.parameters())
    # each linear weight takes half a byte (+ 2 / GROUP for its scale) instead of four, the rest stays float:
    # at least 3 bytes saved per weight (measured 82,176 bytes: 253,696 - 55,296 x 3.09)
    assert len(lowered.buffer) < float_bytes - 3 * weights


@pytest.mark.executorch
def test_runtime_output_within_the_converted_models(lm_8da4w, lowered):
    model, inputs, _, converted = lm_8da4w
    runner = lowered.load()
    (out,) = runner(*inputs)
    ref = converted(*inputs)
    # the program computes the converted model's integers (per-token activations, the same bf16 scales):
    # logits differ by float rounding, far less than the quantization error itself
    step = (ref.clamp(min=0).amax(-1, keepdim=True) - ref.clamp(max=0).amin(-1, keepdim=True)) / 255
    assert ((out - ref).abs() / step).max().item() < 1.0
    assert sqnr(ref, out) > 45
    with torch.no_grad():
        assert sqnr(model(*inputs), out) > 15
    assert torch.equal(runner(*inputs)[0], out)


@pytest.mark.executorch
def test_side_by_side_with_executorchs_own_8da4w(lm_8da4w, lowered):
    """ExecuTorch's own path (torchao 0.18's ``quantize_`` with ``Int8DynamicActivationIntxWeightConfig``,
    then the XNNPACK partitioner) on the same model: the same program size (both store XNNPACK's packed
    4-bit weights and bfloat16 scales) and logits as close to float (benchmarks/bench_8da4w.py at size)."""
    import copy

    pytest.importorskip("torchao", reason="the anchor needs torchao 0.18 (installed with ExecuTorch)")
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    model, inputs, _, _ = lm_8da4w
    anchor = copy.deepcopy(model)
    quantize_(
        anchor, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(GROUP))
    )
    theirs = qx.to_executorch(anchor, inputs)
    assert theirs.delegated.get("aten.linear.default") == lowered.delegated.get("aten.linear.default") == 5
    assert abs(len(lowered.buffer) - len(theirs.buffer)) <= 0.01 * len(theirs.buffer)
    with torch.no_grad():
        reference = model(*inputs)
    ours_out, theirs_out = lowered.load()(*inputs)[0], theirs.load()(*inputs)[0]
    assert sqnr(reference, ours_out) >= sqnr(reference, theirs_out) - 0.5

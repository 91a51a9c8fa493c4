"""quantweave as a drop-in for torchao's PT2E flow: what PT2E users write runs unchanged, and
convert behaves as they expect (no torchao needed here; tests/peer/test_dropin_peer.py
compares with torchao 0.18)."""

from __future__ import annotations

import copy

import pytest
import torch

import quantweave as qw
from quantweave.convert import choose_qparams_ops, dequantize_ops, quantize_ops
from quantweave.observers import FakeQuantizeBase, MinMaxObserver, PerChannelMinMaxObserver, PlaceholderObserver
from quantweave.testing.reference import _Annotator, make_reference_quantizer, quantweave_api
from tests.helpers import (
    ChunkedConvBn,
    ConvBn,
    ConvBnQATQuantizer,
    IndexPutBuffer,
    KVCache,
    PaddedConvBn,
    RefNet,
    ScanLinear,
    TwoLinears,
    assert_names,
    calls,
    export,
)
from tests.helpers import randomise_bn as _randomise_bn
from tests.seed_tutorial import TutorialNet, build, quantweave_names

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def run_flow(model, inputs, quantizer, calibration=None, **convert_kwargs):
    prepared = qw.prepare_pt2e(export(model, *inputs), quantizer)
    for batch in calibration or [inputs]:
        prepared(*batch)
    return prepared, qw.convert_pt2e(prepared, **convert_kwargs)


class OneSpec(qw.Quantizer):
    """Puts ``input_spec`` on a target op's first input, optional ``weight_spec`` / ``bias_spec``
    on its second / third, and ``output_spec`` on its output."""

    def __init__(self, target, input_spec=None, output_spec=None, weight_spec=None, bias_spec=None, tag=None):
        self.target, self.tag = target, tag
        self.input_spec, self.output_spec = input_spec, output_spec
        self.weight_spec, self.bias_spec = weight_spec, bias_spec

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.op != "call_function" or node.target != self.target:
                continue
            specs = {node.args[0]: self.input_spec}
            if self.weight_spec is not None:
                specs[node.args[1]] = self.weight_spec
            if self.bias_spec is not None and len(node.args) > 2:
                specs[node.args[2]] = self.bias_spec
            node.meta["quantization_annotation"] = qw.QuantizationAnnotation(
                input_qspec_map={k: v for k, v in specs.items() if v is not None},
                output_qspec=self.output_spec,
                _annotated=True,
            )
            if self.tag is not None:
                node.meta["quantization_tag"] = self.tag
        return model

    def validate(self, model):
        pass


def int8_act(**kw):
    args = dict(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine)
    args.update(kw)
    return qw.QuantizationSpec(observer_or_fake_quant_ctr=MinMaxObserver, **args)


# -- 1. the seed tutorial's quantizer, unchanged


def test_seed_tutorial_quantizer_constructs_and_runs():
    torch.manual_seed(0)
    model, x = TutorialNet().eval(), torch.randn(2, 3, 8, 8)
    quantizer = build(quantweave_names())
    _, converted = run_flow(model, (x,), quantizer, [(torch.randn(2, 3, 8, 8),) for _ in range(4)])
    # the float32 bias spec is a placeholder: the biases reach the convs as float parameters
    for conv in calls(converted, aten.conv2d.default):
        bias = conv.args[2]
        assert bias.op == "get_attr" and converted.get_parameter(str(bias.target)).dtype == torch.float32
        assert conv.args[1].target in dequantize_ops()  # the weight is quantized
    # input, conv1 out (max_pool shares it), conv2 out, add's shared qparams, sigmoid out
    assert len(calls(converted, *quantize_ops())) >= 4
    out = converted(x)
    assert torch.allclose(out, model(x), atol=0.05)


def test_float_placeholder_specs_leave_the_tensor_float():
    for dtype in (torch.float32, torch.bfloat16):
        spec = qw.QuantizationSpec(dtype=dtype, observer_or_fake_quant_ctr=PlaceholderObserver)
        model, x = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4)
        _, converted = run_flow(model, (x,), OneSpec(aten.linear.default, input_spec=spec, output_spec=spec))
        assert not calls(converted, *quantize_ops(), *dequantize_ops())
        assert not [n for n in converted.graph.nodes if "activation_post_process" in str(n.target)]
        assert torch.equal(converted(x), model(x))


def test_float16_spec_rounds_through_float16_as_torchao_does():
    spec = qw.QuantizationSpec(dtype=torch.float16, observer_or_fake_quant_ctr=PlaceholderObserver)
    model, x = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4) * 1000 + 0.123456
    _, converted = run_flow(model, (x,), OneSpec(aten.linear.default, input_spec=spec))
    casts = calls(converted, qd.convert_element_type.no_fuse)
    assert [c.args[1] for c in casts] == [torch.float16, torch.float32]
    expected = model(x.half().float())
    assert torch.equal(converted(x), expected)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_spec_is_quantized_with_the_decomposed_ops(dtype):
    info = torch.finfo(dtype)
    spec = qw.QuantizationSpec(
        dtype=dtype,
        quant_min=int(info.min),
        quant_max=int(info.max),
        qscheme=torch.per_tensor_affine,
        observer_or_fake_quant_ctr=MinMaxObserver,
    )
    model, x = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4)
    _, converted = run_flow(model, (x,), OneSpec(aten.linear.default, input_spec=spec))
    (quant,) = calls(converted, qd.quantize_per_tensor.default)
    assert quant.args[-1] == dtype and quant.args[3:5] == (int(info.min), int(info.max))
    scale, zero_point = quant.args[1:3]
    q = qd.quantize_per_tensor.default(x, scale, zero_point, int(info.min), int(info.max), dtype)
    assert q.dtype == dtype
    expected = model(qd.dequantize_per_tensor.default(q, scale, zero_point, int(info.min), int(info.max), dtype))
    assert torch.equal(converted(x), expected)


def test_float8_bounds_left_unset_take_the_finite_range():
    spec = qw.QuantizationSpec(
        dtype=torch.float8_e4m3fn, qscheme=torch.per_tensor_symmetric, observer_or_fake_quant_ctr=MinMaxObserver
    )
    _, converted = run_flow(
        torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),), OneSpec(aten.linear.default, input_spec=spec)
    )
    (quant,) = calls(converted, qd.quantize_per_tensor.default)
    assert quant.args[3:5] == (-448, 448)


def test_per_channel_spec_without_ch_axis_takes_the_observer_default():
    spec = qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=-127,
        quant_max=127,
        qscheme=torch.per_channel_symmetric,
        observer_or_fake_quant_ctr=PerChannelMinMaxObserver,
    )
    assert spec.ch_axis is None
    _, converted = run_flow(
        TutorialNet().eval(), (torch.randn(1, 3, 8, 8),), build(quantweave_names(), weight_per_channel=True)
    )
    per_channel = calls(converted, qd.dequantize_per_channel.default)
    assert len(per_channel) == 2 and all(n.args[3] == 0 for n in per_channel)  # axis 0: output channels


@pytest.mark.parametrize(
    ("kwargs", "field", "expected", "got"),
    [
        ({"dtype": torch.float64}, "dtype", "torch.int8", "torch.float64"),
        ({"dtype": torch.float16, "is_dynamic": True}, "is_dynamic", "integer dtype", "torch.float16"),
        ({"dtype": torch.float8_e5m2, "quant_min": -(10**6)}, "quant_min", "finite range", "-1000000"),
        ({"dtype": torch.float32, "quant_min": 0.5}, "quant_min", "int or None", "0.5"),
        (
            {"dtype": torch.float8_e4m3fn, "group_size": 32, "qscheme": torch.per_channel_symmetric},
            "group",
            "integer",
            "float8",
        ),
        ({"dtype": torch.int8, "qscheme": torch.per_channel_affine, "ch_axis": "0"}, "ch_axis", "an int", "'0'"),
    ],
)
def test_genuinely_invalid_specs_still_fail_at_construction(kwargs, field, expected, got):
    with pytest.raises(ValueError) as info:
        qw.QuantizationSpec(observer_or_fake_quant_ctr=MinMaxObserver, **kwargs)
    message = str(info.value)
    assert field in message and expected in message and got in message


# -- 2. behaviour matched where torchao is right


def dynamic_act():
    return qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_tensor_affine,
        is_dynamic=True,
        observer_or_fake_quant_ctr=PlaceholderObserver,
    )


def test_dynamic_quantization_keeps_one_choose_quantize_dequantize_per_tensor():
    model, x = TwoLinears().eval(), torch.randn(3, 8)
    _, converted = run_flow(model, (x,), OneSpec(aten.linear.default, input_spec=dynamic_act()))
    assert len(calls(converted, *choose_qparams_ops())) == 1
    assert len(calls(converted, qd.quantize_per_tensor.tensor)) == 1
    (dequant,) = calls(converted, qd.dequantize_per_tensor.tensor)
    assert {u.target for u in dequant.users} == {aten.linear.default} and len(dequant.users) == 2
    assert torch.allclose(converted(x), model(x), atol=0.05)


def test_static_dequantize_is_still_one_per_user():
    model, x = TwoLinears().eval(), torch.randn(3, 8)
    _, converted = run_flow(model, (x,), OneSpec(aten.linear.default, input_spec=int8_act()))
    assert all(len(n.users) == 1 for n in calls(converted, *dequantize_ops()))
    assert len(calls(converted, qd.dequantize_per_tensor.default)) == 2


def test_buffer_mutated_in_place_is_never_folded_into_a_constant():
    torch.manual_seed(0)
    model = KVCache().eval()
    weight = int8_act(qscheme=torch.per_tensor_symmetric)
    quantizer = OneSpec(aten.linear.default, input_spec=int8_act(), weight_spec=weight)
    prepared = qw.prepare_pt2e(export(copy.deepcopy(model), torch.randn(1, 8), torch.tensor([1])), quantizer)
    for step in range(4):
        prepared(torch.randn(1, 8) * 2, torch.tensor([step]))
    converted = qw.convert_pt2e(prepared)
    converted.get_buffer("cache").zero_()
    frozen = [n for n in converted.graph.nodes if n.op == "get_attr" and "_frozen_param" in str(n.target)]
    assert len(frozen) == 1  # the weight is folded; the cache is quantized at run time
    (cache_quant,) = [n for n in calls(converted, qd.quantize_per_tensor.default) if n.args[0].op == "get_attr"]
    assert cache_quant.args[0].target == "cache"
    for step in range(4):  # each call sees the previous writes, as the float model does
        x = torch.randn(1, 8)
        expected = model(x, torch.tensor([step]))
        assert torch.allclose(converted(x, torch.tensor([step])), expected, atol=0.1), step
    assert torch.equal(converted.get_buffer("cache"), model.cache)


class IndexPutQuantizer(qw.Quantizer):
    """Annotates index_put_'s destination (the buffer), its values and its output, sharing qparams."""

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.op == "call_function" and node.target == aten.index_put_.default:
                dst, value = node.args[0], node.args[2]
                shared = qw.SharedQuantizationSpec((dst, node))
                node.meta["quantization_annotation"] = qw.QuantizationAnnotation(
                    input_qspec_map={dst: int8_act(qscheme=torch.per_tensor_symmetric), value: shared},
                    output_qspec=shared,
                    _annotated=True,
                )
        return model

    def validate(self, model):
        pass


def test_in_place_destination_buffer_gets_no_observer_and_stays_a_buffer():
    inputs = (torch.tensor([1.0, 2.0]), torch.tensor([1, 3]))
    prepared = qw.prepare_pt2e(export(IndexPutBuffer(), *inputs), IndexPutQuantizer())
    (put,) = calls(prepared, aten.index_put_.default)
    assert put.args[0].op == "get_attr" and put.args[0].target == "buf"  # written directly, not through an observer
    prepared(*inputs)
    converted = qw.convert_pt2e(prepared)
    assert "buf" in dict(converted.named_buffers())
    assert not any("_frozen_param" in str(n.target) for n in converted.graph.nodes)
    converted(*inputs)
    # the buffer itself was written (with the values quantized: they share the buffer's qparams)
    assert torch.allclose(converted.get_buffer("buf"), torch.tensor([0.0, 1.0, 0.0, 2.0]), atol=0.01)


def test_quantization_tag_is_ported_to_static_and_dynamic_qdq():
    model, x = TwoLinears().eval(), torch.randn(3, 8)
    quantizer = OneSpec(aten.linear.default, input_spec=dynamic_act(), tag="dyn_linear")
    _, converted = run_flow(model, (x,), quantizer)
    created = calls(converted, *choose_qparams_ops(), qd.quantize_per_tensor.tensor, qd.dequantize_per_tensor.tensor)
    assert len(created) == 3 and all(n.meta.get("quantization_tag") == "dyn_linear" for n in created)

    quantizer = OneSpec(aten.linear.default, input_spec=int8_act(), output_spec=int8_act(), tag="static_linear")
    _, converted = run_flow(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval(), (x,), quantizer)
    (linear,) = calls(converted, aten.linear.default)
    dequant_in = linear.args[0]
    assert dequant_in.meta.get("quantization_tag") == "static_linear"  # the consumer's tag
    (quant_out,) = [u for u in linear.users if u.target in quantize_ops()]
    assert quant_out.meta.get("quantization_tag") == "static_linear"  # the producer's tag
    (quant_in,) = [n for n in calls(converted, *quantize_ops()) if n.args[0].target == aten.relu.default]
    assert "quantization_tag" not in quant_in.meta  # relu is not in a tagged pattern


class SelfConvertingObserver(torch.nn.Module):
    """Not a torch observer: converts itself (the protocol torchao's affine observers use)."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.seen: list[str] = []

    def forward(self, x):
        return x

    def calculate_qparams(self):
        return torch.tensor([1.0]), torch.tensor([0])

    def convert(self, model, observer_node):
        self.seen.append(observer_node.name)
        with model.graph.inserting_before(observer_node):
            rounded = model.graph.call_function(aten.round.default, (observer_node.args[0],))
        observer_node.replace_all_uses_with(rounded)
        model.graph.erase_node(observer_node)


def test_observer_convert_hook_is_honoured():
    spec = qw.QuantizationSpec(
        dtype=torch.int8, qscheme=torch.per_tensor_affine, observer_or_fake_quant_ctr=SelfConvertingObserver
    )
    model, x = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4) * 3
    prepared, converted = run_flow(model, (x,), OneSpec(aten.linear.default, input_spec=spec))
    observer = prepared.get_submodule("activation_post_process_0")
    assert len(observer.seen) == 1
    assert len(calls(converted, aten.round.default)) == 1
    assert torch.equal(converted(x), model(x.round()))
    assert any(n.op == "call_module" for n in prepared.graph.nodes if "activation_post_process" in str(n.target))


# -- QAT convert after a pass rebuilt the batch norm (torchao's move_exported_model_to_eval does)


def test_qat_convert_finds_a_batch_norm_rebuilt_after_prepare():
    torch.manual_seed(0)
    prepared = qw.prepare_qat_pt2e(
        torch.export.export(ConvBn().train(), (torch.randn(2, 3, 8, 8),)).module(), ConvBnQATQuantizer()
    )
    for _ in range(3):
        prepared(torch.randn(2, 3, 8, 8))
    graph = prepared.graph
    (bn,) = calls(prepared, aten.batch_norm.default)
    with graph.inserting_after(bn):  # a new node in eval mode, under a new name
        args = list(bn.args)
        args[5] = False
        rebuilt = graph.call_function(aten.batch_norm.default, tuple(args))
    bn.replace_all_uses_with(rebuilt)
    graph.erase_node(bn)
    prepared.recompile()
    converted = qw.convert_pt2e(prepared)
    assert not calls(converted, aten.batch_norm.default)  # folded into the conv
    for module in prepared.modules():  # the simulation with its qparams frozen
        if isinstance(module, FakeQuantizeBase):
            module.disable_observer()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), prepared(x), rtol=1e-5, atol=1e-5)


# -- eval() / train() on prepared and converted models


def test_eval_and_train_raise_pointing_at_the_move_helpers():
    model, x = TwoLinears().eval(), torch.randn(3, 8)
    prepared, converted = run_flow(model, (x,), OneSpec(aten.linear.default, input_spec=int8_act()))
    for gm in (prepared, converted):
        for call in (gm.eval, gm.train):
            with pytest.raises(NotImplementedError, match="move_exported_model_to_eval"):
                call()
    assert qw.allow_exported_model_train_eval(prepared) is prepared
    prepared.eval()
    assert prepared.training is False
    prepared.train()
    assert prepared.training is True


# -- batch-norm folding coverage


def test_conv_with_string_padding_folds_its_batch_norm():
    model, x = PaddedConvBn().eval(), torch.randn(1, 3, 8, 8)
    _randomise_bn(model.bn)
    exported = export(model, x)
    assert calls(exported, aten.conv2d.padding)
    prepared = qw.prepare_pt2e(exported, OneSpec(aten.conv2d.padding))
    assert not calls(prepared, aten.batch_norm.default)
    assert torch.allclose(prepared(x), model(x), atol=1e-5)


def test_linear_batch_norm_over_a_3d_output_is_left_with_a_warning():
    model, x = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.BatchNorm1d(5)).eval(), torch.randn(2, 5, 3)
    _randomise_bn(model[1])
    with pytest.warns(UserWarning) as caught:
        prepared = qw.prepare_pt2e(export(model, x), OneSpec(aten.linear.default))
    assert_names(caught, "linear+bn", "'linear'", "'batch_norm'")
    assert calls(prepared, aten.batch_norm.default)
    assert torch.allclose(prepared(x), model(x), atol=1e-5)


def test_chunked_batch_norms_fold_and_every_node_keeps_meta():
    model, x = ChunkedConvBn().eval(), torch.rand(1, 3, 8, 8)
    _randomise_bn(model.bn)
    prepared = qw.prepare_pt2e(export(model, x), OneSpec(aten.conv2d.default, input_spec=int8_act()))
    assert not calls(prepared, aten.batch_norm.default)
    folded = [n for n in prepared.graph.nodes if n.op == "get_attr" and "_folded_" in str(n.target)]
    assert len(folded) == 6 and all("nn_module_stack" in n.meta for n in folded)
    assert all(n.meta for n in prepared.graph.nodes if n.op != "output")
    assert torch.allclose(prepared(x), model(x), atol=0.05)


# -- control flow: scan / while_loop bodies are quantized, other subgraphs warn


def _body(gm, op, index):
    (node,) = calls(gm, op)
    return gm.get_submodule(str(node.args[index].target))


def test_scan_body_is_prepared_and_converted():
    torch.manual_seed(0)
    model, inputs = ScanLinear().eval(), (torch.randn(3, 5), torch.zeros(5))
    exported = torch.export.export(model, inputs).module()
    original_body = _body(exported, torch.ops.higher_order.scan, 0)
    quantizer = OneSpec(aten.linear.default, input_spec=int8_act(), output_spec=int8_act())
    prepared = qw.prepare_pt2e(exported, quantizer)
    body = _body(prepared, torch.ops.higher_order.scan, 0)
    assert sum("activation_post_process" in str(n.target) for n in body.graph.nodes) == 2
    assert not any("activation_post_process" in str(n.target) for n in original_body.graph.nodes)  # caller's intact
    result = qw.calibrate(prepared, [inputs])  # the body's observers are calibrate's too
    assert result.observers == 2 and result.observed == 2, result
    converted = qw.convert_pt2e(prepared)
    body = _body(converted, torch.ops.higher_order.scan, 0)
    assert len(calls(body, qd.quantize_per_tensor.default)) == 2
    assert torch.allclose(converted(*inputs), model(*inputs), atol=0.05)


class CondLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(5, 5)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.linear(x), lambda x: x * 2, (x,))


def test_a_cond_branch_left_float_is_named_in_a_warning():
    exported = torch.export.export(CondLinear().eval(), (torch.randn(2, 5),)).module()
    with pytest.warns(UserWarning) as caught:
        qw.prepare_pt2e(exported, OneSpec(aten.linear.default, input_spec=int8_act()))
    assert_names(caught, "'true_graph_0'", "'cond'", "float")


# -- 3. convert_pt2e(..., use_reference_representation=True)


def qdq_ops():
    return (*quantize_ops(), *dequantize_ops())


class PerTensorReference(qw.Quantizer):
    """quantweave's reference quantizer with per-tensor instead of per-channel weights."""

    def annotate(self, model):
        annotator = _Annotator(quantweave_api(), histogram=False, derived_bias=False)
        annotator.weight = int8_act(qscheme=torch.per_tensor_symmetric)
        annotator.run(model)
        return model

    def validate(self, model):
        pass


def _both_forms(model, inputs, quantizer, calibration):
    prepared = qw.prepare_pt2e(export(model, *inputs), quantizer)
    for batch in calibration:
        prepared(*batch)
    return qw.convert_pt2e(prepared), qw.convert_pt2e(prepared, use_reference_representation=True)


def _output_step(qdq_model):
    """The scale of the last quantize before the output (one step of the output's integers)."""
    return [n.args[1] for n in calls(qdq_model, qd.quantize_per_tensor.default)][-1]


@pytest.mark.parametrize("per_channel", [False, True])
def test_reference_representation_matches_the_qdq_form_within_one_step(per_channel):
    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 10, 10), torch.randn(2, 4, 4, 4))
    calibration = [(torch.randn(2, 3, 10, 10), torch.randn(2, 4, 4, 4)) for _ in range(3)]
    quantizer = make_reference_quantizer() if per_channel else PerTensorReference()
    qdq, reference = _both_forms(RefNet().eval(), inputs, quantizer, calibration)
    assert not calls(reference, *qdq_ops())  # every quantize / dequantize is written as arithmetic
    (matmul,) = calls(reference, aten.matmul.default)
    assert all(a.meta.get("val") is None or a.meta["val"].dtype == torch.int32 for a in matmul.args)
    (conv,) = calls(reference, aten.conv2d.default)
    weight = reference.get_buffer(str(conv.args[1].target))
    assert weight.dtype == torch.int32  # integer weights, integer convolution
    (pool,) = calls(reference, aten.max_pool2d.default)
    assert pool.args[0].target is aten._to_copy.default and pool.args[0].kwargs["dtype"] == torch.uint8
    for x in [inputs, *calibration]:
        assert torch.max(torch.abs(reference(*x) - qdq(*x))) <= 2 * _output_step(qdq) + 1e-5


def test_reference_representation_of_dynamic_and_plain_qdq():
    model, x = TwoLinears().eval(), torch.randn(3, 8)
    qdq, reference = _both_forms(model, (x,), OneSpec(aten.linear.default, input_spec=dynamic_act()), [(x,)])
    assert not calls(reference, *qdq_ops()) and calls(reference, *choose_qparams_ops())
    torch.testing.assert_close(reference(x), qdq(x))


def test_use_reference_representation_must_be_a_bool():
    model, x = TwoLinears().eval(), torch.randn(3, 8)
    prepared, _ = run_flow(model, (x,), OneSpec(aten.linear.default, input_spec=int8_act()))
    with pytest.raises(TypeError) as info:
        qw.convert_pt2e(prepared, use_reference_representation="yes")
    assert_names(info, "use_reference_representation", "bool", "'yes'")


def test_a_folded_weight_keeps_its_get_attr_tag():
    class TagWeight(OneSpec):
        def annotate(self, model):
            super().annotate(model)
            for node in calls(model, aten.linear.default):
                node.args[1].meta["quantization_tag"] = "weight_tag"
            return model

    quantizer = TagWeight(aten.linear.default, input_spec=int8_act(), weight_spec=int8_act(), tag="linear")
    _, converted = run_flow(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),), quantizer)
    (linear,) = calls(converted, aten.linear.default)
    dequant_w = linear.args[1]
    assert dequant_w.meta.get("quantization_tag") == "linear"  # the consumer's tag
    assert dequant_w.args[0].op == "get_attr" and dequant_w.args[0].meta.get("quantization_tag") == "weight_tag"


class SelfConvertingWeightObserver(SelfConvertingObserver):
    """Converts itself into quantize_per_tensor -> dequantize_per_tensor (scale 0.1, int8)."""

    def convert(self, model, observer_node):
        with model.graph.inserting_before(observer_node):
            args = (0.1, 0, -128, 127, torch.int8)
            quant = model.graph.call_function(qd.quantize_per_tensor.default, (observer_node.args[0], *args))
            dequant = model.graph.call_function(qd.dequantize_per_tensor.default, (quant, *args))
        observer_node.replace_all_uses_with(dequant)
        model.graph.erase_node(observer_node)


def test_constant_quantize_made_by_a_convert_hook_is_folded():
    spec = qw.QuantizationSpec(
        dtype=torch.int8, qscheme=torch.per_tensor_affine, observer_or_fake_quant_ctr=SelfConvertingWeightObserver
    )
    model, x = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4)
    _, converted = run_flow(model, (x,), OneSpec(aten.linear.default, weight_spec=spec))
    assert not calls(converted, qd.quantize_per_tensor.default)  # stored quantized, as convert's own
    (linear,) = calls(converted, aten.linear.default)
    frozen = linear.args[1].args[0]
    assert frozen.op == "get_attr" and converted.get_buffer(str(frozen.target)).dtype == torch.int8
    _, unfolded = run_flow(model, (x,), OneSpec(aten.linear.default, weight_spec=spec), fold_quantize=False)
    assert len(calls(unfolded, qd.quantize_per_tensor.default)) == 1
    torch.testing.assert_close(converted(x), unfolded(x))

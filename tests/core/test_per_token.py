"""Per-token dynamic quantization in the core: ``QuantizationSpec(per_token=True)`` (validation,
compatibility with PT2E specs), prepare (observer marking, QAT refused, sharing) and convert
(``choose_qparams_per_token_asymmetric`` -> ``quantize_per_token`` -> ``dequantize_per_token``)."""

import dataclasses

import pytest
import torch
from torch import nn

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, dequantize_ops, quantize_ops
from quantweave.convert import choose_qparams_ops
from quantweave.observers import MinMaxObserver, PerChannelMinMaxObserver, PlaceholderObserver
from quantweave.plugin_api import ANNOTATION_KEY, mark_annotated
from quantweave.testing.reference import weight_spec
from tests.helpers import assert_names

dequantize_ops()  # registers torch.ops.quantized_decomposed
qd = torch.ops.quantized_decomposed
aten = torch.ops.aten


def act_spec(per_token=True, **overrides):
    fields = {
        "dtype": torch.int8,
        "quant_min": -128,
        "quant_max": 127,
        "qscheme": torch.per_tensor_affine,
        "is_dynamic": True,
        "observer_or_fake_quant_ctr": PlaceholderObserver,
        "per_token": per_token,
    }
    fields.update(overrides)
    return qw.QuantizationSpec(**fields)


WEIGHT = weight_spec(qw, PerChannelMinMaxObserver, narrow=True)


class DynamicLinearQuantizer(qw.Quantizer):
    """Quantizes the input of every linear with ``acts[i]`` (i-th linear, last one repeating)
    and its weight per channel; ``implicit_sharing`` goes to every annotation."""

    def __init__(self, *acts, implicit_sharing=True):
        self.acts, self.implicit_sharing = acts, implicit_sharing

    def annotate(self, model):
        linears = [n for n in model.graph.nodes if n.op == "call_function" and n.target == aten.linear.default]
        for i, node in enumerate(linears):
            annotate_input_qspec_map(node, node.args[0], self.acts[min(i, len(self.acts) - 1)])
            annotate_input_qspec_map(node, node.args[1], WEIGHT)
            node.meta[ANNOTATION_KEY].allow_implicit_sharing = self.implicit_sharing
            mark_annotated(node)
        return model


class TwoHeads(nn.Module):
    """One tensor read by two linears (the case implicit sharing looks at)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(16, 4)

    def forward(self, x):
        return self.a(x), self.b(x)


def convert(model, quantizer, x, qat=False):
    exported = torch.export.export(model, (x,)).module()
    prepare = qw.prepare_qat_pt2e if qat else qw.prepare_pt2e
    return qw.convert_pt2e(prepare(exported, quantizer))


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


# -- the spec --------------------------------------------------------------------------------------


def test_per_token_is_an_optional_field_that_leaves_pt2e_specs_unchanged():
    plain = act_spec(per_token=False)
    assert plain == qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_tensor_affine,
        is_dynamic=True,
        observer_or_fake_quant_ctr=PlaceholderObserver,
    )
    assert plain.per_token is False
    # PT2E's fields keep their positions; quantweave's additions come after them
    names = [f.name for f in dataclasses.fields(qw.QuantizationSpec)]
    pt2e = ["dtype", "observer_or_fake_quant_ctr", "quant_min", "quant_max", "qscheme", "ch_axis", "is_dynamic"]
    assert names == [*pt2e, "group_size", "per_token"]
    assert act_spec() != plain and hash(act_spec()) != hash(plain)  # a different spec (sharing, caches)
    assert dataclasses.replace(plain, per_token=True) == act_spec()
    assert act_spec(quant_min=None, quant_max=None, qscheme=None).per_token  # defaults are the int8 range


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (
            {"is_dynamic": False, "observer_or_fake_quant_ctr": MinMaxObserver},
            ("per_token=True", "is_dynamic=True", "is_dynamic=False"),
        ),
        (
            {"qscheme": torch.per_tensor_symmetric},
            ("per_token=True", "qscheme", "torch.per_tensor_affine or None", "torch.per_tensor_symmetric"),
        ),
        (
            {"dtype": torch.uint8, "quant_min": 0, "quant_max": 255},
            ("per_token=True", "int8 in [-128, 127]", "dtype=torch.uint8", "quant_min=0", "quant_max=255"),
        ),
        (
            {"quant_min": -127},
            ("per_token=True", "int8 in [-128, 127]", "dtype=torch.int8", "quant_min=-127", "quant_max=127"),
        ),
        ({"per_token": 1}, ("per_token", "bool", "got 1")),
    ],
    ids=["static", "symmetric", "uint8", "narrow-range", "not-bool"],
)
def test_invalid_per_token_specs_say_what_was_expected(overrides, names):
    with pytest.raises(ValueError) as info:
        act_spec(**overrides)
    assert_names(info, "QuantizationSpec", *names)


def test_per_token_and_group_size_exclude_each_other():
    with pytest.raises(ValueError) as info:
        qw.QuantizationSpec(
            dtype=torch.int8,
            observer_or_fake_quant_ctr=PlaceholderObserver,
            qscheme=torch.per_channel_symmetric,
            ch_axis=0,
            group_size=32,
            per_token=True,
            is_dynamic=True,
        )
    assert_names(info, "group-wise", "static")


# -- prepare and convert ---------------------------------------------------------------------------


def test_converts_to_per_token_ops_and_quantizes_each_row_with_its_own_step():
    torch.manual_seed(0)
    model = nn.Linear(16, 8).eval()
    x = torch.randn(2, 5, 16)
    x[0, 0] *= 1000  # a loud token: one scale for the tensor would flatten the quiet ones to a few levels
    converted = convert(model, DynamicLinearQuantizer(act_spec()), x)
    found = targets(converted)
    assert qd.choose_qparams_per_token_asymmetric.default in found
    assert qd.quantize_per_token.default in found and qd.dequantize_per_token.default in found
    assert not {qd.choose_qparams.tensor, qd.quantize_per_tensor.tensor} & set(found)
    assert qd.choose_qparams_per_token_asymmetric.default in choose_qparams_ops()
    assert qd.quantize_per_token.default in quantize_ops()
    assert qd.dequantize_per_token.default in dequantize_ops()

    # what the linear reads: every token rounded to its own grid of 256 levels spanning [min(x, 0), max(x, 0)]
    linear = next(n for n in converted.graph.nodes if n.target == aten.linear.default)
    seen = {}
    handle = torch.fx.Interpreter(converted)
    original = handle.run_node

    def spy(node):
        out = original(node)
        if node is linear.args[0]:
            seen["x"] = out
        return out

    handle.run_node = spy
    handle.run(x)
    read = seen["x"]
    assert read.shape == x.shape and read.dtype == torch.float32
    step = (x.clamp(min=0).amax(-1) - x.clamp(max=0).amin(-1)) / 255  # per token, shape (2, 5)
    error = (read - x).abs().amax(-1)
    assert bool((error <= step / 2 * (1 + 1e-5) + 1e-7).all()), (error / step).max()
    tensor_step = (x.clamp(min=0).max() - x.clamp(max=0).min()) / 255  # what one scale for the tensor would give
    assert error[0, 1:].max() < tensor_step / 50  # the quiet tokens next to the loud one keep their precision
    with torch.no_grad():
        reference = model(x)
        ours = converted(x)
    quiet = slice(1, None)  # the tokens next to the loud one
    assert torch.allclose(ours[0, quiet], reference[0, quiet], atol=0.05)


def test_needs_no_calibration_and_batches_of_any_shape_run():
    model = nn.Linear(16, 8).eval()
    converted = convert(model, DynamicLinearQuantizer(act_spec()), torch.randn(3, 16))
    with torch.no_grad():
        assert converted(torch.randn(3, 16)).shape == (3, 8)


def test_half_precision_inputs_keep_their_dtype():
    model = nn.Linear(16, 8).eval().to(torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    converted = convert(model, DynamicLinearQuantizer(act_spec()), x)
    dq = next(n for n in converted.graph.nodes if n.target == qd.dequantize_per_token.default)
    assert dq.args[-1] == torch.bfloat16
    with torch.no_grad():
        out = converted(x)
    assert out.dtype == torch.bfloat16
    assert (out.float() - model(x).float()).abs().max() < 0.1


def test_the_prepared_model_converts_twice_and_is_not_mutated():
    model = nn.Linear(16, 8).eval()
    x = torch.randn(2, 16)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), DynamicLinearQuantizer(act_spec()))
    before = str(prepared.graph)
    first, second = qw.convert_pt2e(prepared), qw.convert_pt2e(prepared)
    assert str(prepared.graph) == before
    assert torch.equal(first(x), second(x))


def test_qat_is_refused_naming_the_edge_and_the_quantizer():
    model = nn.Linear(16, 8).train()
    quantizer = DynamicLinearQuantizer(act_spec())
    quantizer.name = "mytok"
    with pytest.raises(qw.AnnotationError) as info:
        convert(model, quantizer, torch.randn(2, 16), qat=True)
    assert_names(info, "'input_1'", "'linear'", "'mytok'", "post-training")


def test_a_per_token_and_a_per_tensor_consumer_of_one_tensor_kept_apart_by_opting_out_of_sharing():
    per_tensor = act_spec(per_token=False)
    converted = convert(
        TwoHeads().eval(), DynamicLinearQuantizer(act_spec(), per_tensor, implicit_sharing=False), torch.randn(3, 16)
    )
    reads = {n.name: n.args[0].target for n in converted.graph.nodes if n.target == aten.linear.default}
    assert reads == {"linear": qd.dequantize_per_token.default, "linear_1": qd.dequantize_per_tensor.tensor}


def test_a_per_token_and_a_per_tensor_consumer_of_one_tensor_are_not_merged_by_implicit_sharing():
    per_tensor = act_spec(per_token=False)
    converted = convert(TwoHeads().eval(), DynamicLinearQuantizer(act_spec(), per_tensor), torch.randn(3, 16))
    reads = {n.name: n.args[0].target for n in converted.graph.nodes if n.target == aten.linear.default}
    assert reads == {"linear": qd.dequantize_per_token.default, "linear_1": qd.dequantize_per_tensor.tensor}


def test_two_per_token_consumers_share_one_run_time_quantization():
    converted = convert(TwoHeads().eval(), DynamicLinearQuantizer(act_spec()), torch.randn(3, 16))
    assert targets(converted).count(qd.choose_qparams_per_token_asymmetric.default) == 1
    assert targets(converted).count(qd.dequantize_per_token.default) == 2  # one dequantize per user

"""convert_pt2e: reference q/dq, dynamic quantization, folding, metadata, save/load."""

import io

import pytest
import torch

import quantweave as qw
from quantweave.convert import DEQUANTIZE_OPS
from quantweave.observers import MinMaxObserver, PerChannelMinMaxObserver, PlaceholderObserver
from quantweave.testing.inspect import count_ops, qdq_summary, sqnr
from quantweave.testing.models import calibration_batches, example_inputs, resnet18_like
from quantweave.testing.reference import make_reference_quantizer
from tests.helpers import assert_names, export

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
KEY = "quantization_annotation"


class LinearQuantizer(qw.Quantizer):
    """linear with configurable activation and weight specs."""

    def __init__(self, act, weight):
        self.act, self.weight = act, weight

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.target == aten.linear.default:
                node.meta[KEY] = qw.QuantizationAnnotation(
                    input_qspec_map={node.args[0]: self.act, node.args[1]: self.weight}
                )
        return model


class TwoLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def weight_spec(dtype=torch.int8, qmin=-127, qmax=127):
    return qw.QuantizationSpec(
        dtype=dtype,
        quant_min=qmin,
        quant_max=qmax,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        observer_or_fake_quant_ctr=PerChannelMinMaxObserver,
    )


def act_spec(dtype=torch.uint8, qmin=None, qmax=None, dynamic=False, qscheme=torch.per_tensor_affine):
    ctr = PlaceholderObserver if dynamic else MinMaxObserver
    return qw.QuantizationSpec(
        dtype=dtype,
        quant_min=qmin,
        quant_max=qmax,
        qscheme=qscheme,
        is_dynamic=dynamic,
        observer_or_fake_quant_ctr=ctr,
    )


def quantize(model, quantizer, x, calibrate=True):
    prepared = qw.prepare_pt2e(export(model, x), quantizer)
    if calibrate:
        prepared(x)
    return prepared, qw.convert_pt2e(prepared)


def test_dynamic_activation_uses_choose_qparams_at_run_time():
    model, x = TwoLinear().eval(), torch.randn(4, 16)
    _prepared, converted = quantize(model, LinearQuantizer(act_spec(dynamic=True), weight_spec()), x, calibrate=False)
    targets = [n.target for n in converted.graph.nodes]
    assert targets.count(qd.choose_qparams.tensor) == 2
    assert targets.count(qd.quantize_per_tensor.tensor) == 2
    assert sqnr(model(x), converted(x)) > 30
    # qparams follow the input: a 100x larger input is still represented well
    assert sqnr(model(x * 100), converted(x * 100)) > 30


def test_dynamic_symmetric_uses_the_symmetric_choose_qparams():
    q = LinearQuantizer(act_spec(torch.int8, dynamic=True, qscheme=torch.per_tensor_symmetric), weight_spec())
    _, converted = quantize(TwoLinear().eval(), q, torch.randn(4, 16), calibrate=False)
    assert count_ops(converted, (qd.choose_qparams_symmetric.tensor,)) == 2


@pytest.mark.parametrize(
    ("dtype", "qmin", "qmax"),
    [(torch.int8, -8, 7), (torch.int16, None, None), (torch.uint8, 0, 127), (torch.int8, None, None)],
)
def test_dtypes_and_narrow_ranges_are_honoured(dtype, qmin, qmax):
    model, x = TwoLinear().eval(), torch.randn(8, 16)
    q = LinearQuantizer(act_spec(dtype, qmin, qmax), weight_spec(torch.int8, -8, 7))
    _, converted = quantize(model, q, x)
    summary = qdq_summary(converted)
    act = summary[("linear", "x")]
    lo, hi = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    assert act[2:] == ((lo if qmin is None else qmin), (hi if qmax is None else qmax), dtype)
    weight = summary[("linear", "<constant arg 1>")]
    assert weight[2:] == (0, -8, 7, torch.int8)
    stored = [b for n, b in converted.named_buffers() if n.startswith("_frozen_param")]
    assert stored and all(b.dtype == torch.int8 and b.min() >= -8 and b.max() <= 7 for b in stored)


def test_weights_need_no_calibration_and_the_prepared_model_is_not_touched():
    model, x = TwoLinear().eval(), torch.randn(4, 16)
    q = LinearQuantizer(act_spec(dynamic=True), weight_spec())
    prepared = qw.prepare_pt2e(export(model, x), q)
    weight_observers = [m for m in prepared.modules() if isinstance(m, PerChannelMinMaxObserver)]
    converted = qw.convert_pt2e(prepared)
    assert len(weight_observers) == 2, "one weight observer per linear"
    assert all(m.min_val.numel() == 0 for m in weight_observers), "prepared observers unchanged"
    assert sqnr(model(x), converted(x)) > 30


def test_converting_uncalibrated_observers_names_them():
    model = TwoLinear().eval()
    prepared = qw.prepare_pt2e(export(model, torch.randn(2, 16)), LinearQuantizer(act_spec(), weight_spec()))
    with pytest.raises(qw.ObserverNotCalibratedError) as info:
        qw.convert_pt2e(prepared)
    assert_names(info, "2 observer(s)", "never saw data", "'x'", "'relu'", "calibration")


def test_one_dequantize_per_user():
    class Fanout(torch.nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            return y + 1, y * 2, y - 3

    def annotate(gm):
        relu = next(n for n in gm.graph.nodes if n.target == aten.relu.default)
        relu.meta[KEY] = qw.QuantizationAnnotation(output_qspec=act_spec())

    class Q(qw.Quantizer):
        def annotate(self, model):
            annotate(model)
            return model

    _, converted = quantize(Fanout(), Q(), torch.randn(5))
    dqs = [n for n in converted.graph.nodes if n.target in DEQUANTIZE_OPS]
    assert len(dqs) == 3 and all(len(n.users) == 1 for n in dqs)


def test_metadata_is_carried_to_quantize_and_dequantize_nodes():
    model, x = TwoLinear().eval(), torch.randn(4, 16)
    _, converted = quantize(model, LinearQuantizer(act_spec(), weight_spec()), x)
    relu = next(n for n in converted.graph.nodes if n.target == aten.relu.default)
    q = next(n for n in relu.users)
    assert q.target == qd.quantize_per_tensor.default
    dq = next(iter(q.users))
    for node in (q, dq):
        assert node.meta["stack_trace"] == relu.meta["stack_trace"]
        assert node.meta["nn_module_stack"] == relu.meta["nn_module_stack"]


def test_convert_leaves_the_prepared_model_reusable():
    model, x = TwoLinear().eval(), torch.randn(4, 16)
    prepared, first = quantize(model, LinearQuantizer(act_spec(), weight_spec()), x)
    graph_before = str(prepared.graph)
    second = qw.convert_pt2e(prepared)
    unfolded = qw.convert_pt2e(prepared, fold_quantize=False)
    assert str(prepared.graph) == graph_before
    assert torch.equal(first(x), second(x))
    assert torch.equal(first(x), unfolded(x))
    assert count_ops(unfolded, (qd.quantize_per_channel.default,)) == 2


def test_saved_converted_model_is_small_and_round_trips_exactly(tmp_path):
    model = resnet18_like()  # ResNet-18 size: per-model overhead is small next to weights
    x = example_inputs(model, image=64)[0]
    prepared = qw.prepare_pt2e(export(model, x), make_reference_quantizer())
    for (batch,) in calibration_batches(model, 2, image=64):
        prepared(batch)
    converted = qw.convert_pt2e(prepared)

    def save(module, name):
        path = tmp_path / name
        torch.export.save(torch.export.export(module, (x,)), path)
        return path

    fp32 = save(model, "fp32.pt2")
    int8 = save(converted, "int8.pt2")
    ratio = int8.stat().st_size / fp32.stat().st_size
    assert ratio <= 0.27, f"saved int8 model is {ratio:.3f}x the fp32 file"
    loaded = torch.export.load(int8).module()
    assert torch.equal(loaded(x), converted(x))
    buffer = io.BytesIO()
    torch.export.save(torch.export.load(int8), buffer)
    assert buffer.getbuffer().nbytes > 0


# -- fold_quantize=False: weights stay float, quantize -> dequantize in the graph -----------------


def _unfolded_and_folded(model, x, quantizer):
    prepared = qw.prepare_pt2e(export(model, x), quantizer)
    prepared(x)
    return qw.convert_pt2e(prepared, fold_quantize=False), qw.convert_pt2e(prepared)


def test_unfolded_weights_stay_float_parameters_followed_by_quantize_dequantize():
    model, x = TwoLinear().eval(), torch.randn(4, 16)
    unfolded, folded = _unfolded_and_folded(model, x, LinearQuantizer(act_spec(torch.int8), weight_spec()))
    weight_qs = [n for n in unfolded.graph.nodes if n.target == qd.quantize_per_channel.default]
    assert len(weight_qs) == 2, "one per-channel quantize per linear weight"
    for q in weight_qs:
        source = q.args[0]
        assert source.op == "get_attr", f"{q.name} quantizes {source.op} {source.name}, not a stored weight"
        stored = unfolded.get_parameter(source.target)
        assert stored.dtype == torch.float32, f"{source.target} is stored as {stored.dtype}"
        (dq,) = q.users
        assert dq.target == qd.dequantize_per_channel.default
        assert {u.target for u in dq.users} == {aten.linear.default}
    # the float weights are the model's own values (nothing is rounded into storage)
    assert torch.equal(unfolded.get_parameter(weight_qs[0].args[0].target), model.a.weight)
    assert not [name for name, _ in unfolded.named_buffers() if name.startswith("_frozen_param")]
    assert [b.dtype for n, b in folded.named_buffers() if n.startswith("_frozen_param")] == [torch.int8] * 2


def test_unfolded_and_folded_models_compute_the_same_outputs():
    model = resnet18_like()
    x = example_inputs(model, image=32)[0]
    prepared = qw.prepare_pt2e(export(model, x), make_reference_quantizer())
    for (batch,) in calibration_batches(model, 2, image=32):
        prepared(batch)
    folded = qw.convert_pt2e(prepared)
    unfolded = qw.convert_pt2e(prepared, fold_quantize=False)
    assert count_ops(unfolded, (qd.quantize_per_channel.default,)) > 0
    # the same integer weights, rounded at run time instead of at convert time
    torch.testing.assert_close(unfolded(x), folded(x), rtol=1e-5, atol=1e-5)


def test_unfolded_model_exports_saves_and_loads_with_identical_outputs(tmp_path):
    model, x = TwoLinear().eval(), torch.randn(4, 16)
    unfolded, _ = _unfolded_and_folded(model, x, LinearQuantizer(act_spec(torch.int8), weight_spec()))
    program = torch.export.export(unfolded, (x,))
    assert count_ops(program.module(), (qd.quantize_per_channel.default,)) == 2
    path = tmp_path / "unfolded.pt2"
    torch.export.save(program, path)
    loaded = torch.export.load(path).module()
    assert torch.equal(loaded(x), unfolded(x))
    assert count_ops(loaded, (qd.quantize_per_channel.default,)) == 2


def test_fold_quantize_must_be_a_bool():
    model, x = TwoLinear().eval(), torch.randn(4, 16)
    prepared = qw.prepare_pt2e(export(model, x), LinearQuantizer(act_spec(), weight_spec()))
    prepared(x)
    with pytest.raises(TypeError) as info:
        qw.convert_pt2e(prepared, fold_quantize="no")
    assert_names(info, "fold_quantize", "bool", "'no'")


def test_new_attr_name_with_a_memo_names_what_a_search_from_zero_names():
    """Convert names frozen weights one after another, starting each search after the last name
    (linear in the number of weights): the names are those of a search from 0 every time, with
    names taken beforehand, names another prefix takes and names registered between the calls."""
    from quantweave._modules.graph import new_attr_name

    def names(memo):
        module = torch.nn.Module()
        module.register_buffer("_frozen_param1", torch.zeros(1))  # taken before: skipped, 0 is free
        module.register_buffer("_frozen_param3", torch.zeros(1))
        got = []
        for i in range(6):
            prefix = "_frozen_param" if i != 2 else "_other_"
            name = new_attr_name(module, prefix, memo)
            module.register_buffer(name, torch.zeros(1))
            got.append(name)
        return got

    expected = ["_frozen_param0", "_frozen_param2", "_other_0", "_frozen_param4", "_frozen_param5", "_frozen_param6"]
    assert names(None) == expected
    assert names({}) == expected

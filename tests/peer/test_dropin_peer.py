"""quantweave as a drop-in for torchao 0.18's PT2E flow: the same quantizer (written once against
an API namespace, or with quantweave's classes where torchao's annotation classes are not yet
translated by our prepare) through both flows gives the same result -- or a difference listed
in docs/torchao-differences.md (each such test says which row)."""

from __future__ import annotations

import copy
import types
import warnings

import pytest
import torch

import quantweave as qw
from quantweave.testing.inspect import qdq_summary
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
    calls,
    export,
    randomise_bn,
)
from tests.seed_tutorial import TutorialNet, build, quantweave_names, torchao_names

pytestmark = pytest.mark.peer
aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


@pytest.fixture(scope="module")
def ao():
    from torchao.quantization import pt2e
    from torchao.quantization.pt2e import observer, quantize_pt2e, quantizer

    return types.SimpleNamespace(
        prepare=quantize_pt2e.prepare_pt2e,
        prepare_qat=quantize_pt2e.prepare_qat_pt2e,
        convert=quantize_pt2e.convert_pt2e,
        move_to_eval=pt2e.move_exported_model_to_eval,
        api=types.SimpleNamespace(quantizer=quantizer, observer=observer),
    )


def qw_api():
    from quantweave import observers

    return types.SimpleNamespace(quantizer=qw, observer=observers)


def both(ao):
    """(name, api namespace, prepare, convert) for quantweave and torchao."""
    return [
        ("quantweave", qw_api(), qw.prepare_pt2e, qw.convert_pt2e),
        ("torchao", ao.api, ao.prepare, ao.convert),
    ]


class OneOp:
    """A quantizer factory: ``spec`` on ``target``'s first input, ``weight`` on its second,
    ``output`` on its output and ``tag`` as quantization_tag, with the given API's classes."""

    def __init__(self, target, spec=None, weight=None, output=None, tag=None):
        self.target, self.spec, self.weight, self.output, self.tag = target, spec, weight, output, tag

    def __call__(self, api):
        factory = self

        class Q(api.quantizer.Quantizer):
            def annotate(self, model):
                for node in model.graph.nodes:
                    if node.op != "call_function" or node.target != factory.target:
                        continue
                    specs = {}
                    if factory.spec is not None:
                        specs[node.args[0]] = factory.spec(api)
                    if factory.weight is not None:
                        specs[node.args[1]] = factory.weight(api)
                    node.meta["quantization_annotation"] = api.quantizer.QuantizationAnnotation(
                        input_qspec_map=specs,
                        output_qspec=None if factory.output is None else factory.output(api),
                        _annotated=True,
                    )
                    if factory.tag is not None:
                        node.meta["quantization_tag"] = factory.tag
                return model

            def validate(self, model):
                pass

        return Q()


def int8(api, **kw):
    args = dict(
        dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_tensor_affine,
        observer_or_fake_quant_ctr=api.observer.MinMaxObserver,
    )
    args.update(kw)
    return api.quantizer.QuantizationSpec(**args)


def dynamic(api):
    return int8(api, is_dynamic=True, observer_or_fake_quant_ctr=api.observer.PlaceholderObserver)


def run(flow, model, inputs, make_quantizer, calibration=None, **convert_kwargs):
    _, api, prepare, convert = flow
    prepared = prepare(export(copy.deepcopy(model), *inputs), make_quantizer(api))
    for batch in calibration or [inputs]:
        prepared(*batch)
    return prepared, convert(prepared, **convert_kwargs)


# -- the seed tutorial's quantizer


def test_seed_tutorial_quantizer_equals_torchao(ao):
    torch.manual_seed(0)
    model, x = TutorialNet().eval(), torch.randn(2, 3, 8, 8)
    calibration = [(torch.randn(2, 3, 8, 8),) for _ in range(3)]
    results = []
    for names, prepare, convert in (
        (quantweave_names(), qw.prepare_pt2e, qw.convert_pt2e),
        (torchao_names(), ao.prepare, ao.convert),
    ):
        prepared = prepare(export(copy.deepcopy(model), x), build(names))
        for batch in calibration:
            prepared(*batch)
        converted = convert(prepared)
        results.append((qdq_summary(converted), converted(x)))
    (ours, out), (theirs, ref) = results
    assert ours == theirs and len(ours) > 0
    assert torch.equal(out, ref)


def test_per_channel_spec_without_ch_axis(ao):
    """Documented difference 'ch_axis unset': torchao passes ch_axis=None to a PerChannel*
    observer, which fails at calibration; quantweave leaves the observer its default axis 0."""
    model, x = TutorialNet().eval(), torch.randn(1, 3, 8, 8)
    prepared = ao.prepare(export(copy.deepcopy(model), x), build(torchao_names(), weight_per_channel=True))
    with pytest.raises(TypeError):
        prepared(x)
    prepared = qw.prepare_pt2e(export(copy.deepcopy(model), x), build(quantweave_names(), weight_per_channel=True))
    prepared(x)
    assert all(n.args[3] == 0 for n in calls(qw.convert_pt2e(prepared), qd.dequantize_per_channel.default))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_float_placeholder_specs_equal_torchao(ao, dtype):
    def spec(api):
        return api.quantizer.QuantizationSpec(dtype=dtype, observer_or_fake_quant_ctr=api.observer.PlaceholderObserver)

    model, x = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4) * 1000 + 0.1234
    outs = []
    for flow in both(ao):
        _, converted = run(flow, model, (x,), OneOp(aten.linear.default, spec=spec))
        outs.append((len(calls(converted, qd.convert_element_type.no_fuse)), converted(x)))
    (n_ours, ours), (n_theirs, theirs) = outs
    assert n_ours == n_theirs and torch.equal(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_specs_equal_torchao(ao, dtype):
    info = torch.finfo(dtype)

    def spec(api):
        return int8(api, dtype=dtype, quant_min=int(info.min), quant_max=int(info.max))

    model, x = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4)
    (s1, o1), (s2, o2) = [
        (qdq_summary(c), c(x))
        for c in (run(f, model, (x,), OneOp(aten.linear.default, spec=spec))[1] for f in both(ao))
    ]
    assert s1 == s2 and torch.equal(o1, o2)


# -- convert


def test_dynamic_quantization_node_counts_equal_torchao(ao):
    model, x = TwoLinears().eval(), torch.randn(3, 8)
    counts, outs = [], []
    for flow in both(ao):
        _, converted = run(flow, model, (x,), OneOp(aten.linear.default, spec=dynamic))
        ops = (qd.choose_qparams.tensor, qd.quantize_per_tensor.tensor, qd.dequantize_per_tensor.tensor)
        counts.append([len(calls(converted, op)) for op in ops])
        outs.append(converted(x))
    assert counts[0] == counts[1] == [1, 1, 1]
    assert torch.equal(outs[0], outs[1])


def test_index_put_buffer_stays_a_buffer_as_in_torchao(ao):
    inputs = (torch.tensor([1.0, 2.0]), torch.tensor([1, 3]))

    def quantizer(api):
        class Q(api.quantizer.Quantizer):
            def annotate(self, model):
                for node in model.graph.nodes:
                    if node.op == "call_function" and node.target == aten.index_put_.default:
                        dst, value = node.args[0], node.args[2]
                        shared = api.quantizer.SharedQuantizationSpec((dst, node))
                        node.meta["quantization_annotation"] = api.quantizer.QuantizationAnnotation(
                            input_qspec_map={dst: int8(api, qscheme=torch.per_tensor_symmetric), value: shared},
                            output_qspec=shared,
                            _annotated=True,
                        )
                return model

            def validate(self, model):
                pass

        return Q()

    buffers, outs = [], []
    for flow in both(ao):
        _, converted = run(flow, IndexPutBuffer(), inputs, quantizer)
        outs.append(converted(*inputs))
        buffers.append(converted.get_buffer("buf").clone())
    torch.testing.assert_close(buffers[0], buffers[1])
    torch.testing.assert_close(outs[0], outs[1])


def test_kv_cache_read_then_written_is_not_frozen_in_either(ao):
    torch.manual_seed(0)
    model = KVCache().eval()

    def quantizer(api):
        return OneOp(aten.linear.default, spec=int8, weight=lambda a: int8(a, qscheme=torch.per_tensor_symmetric))(api)

    results = []
    calibration = [(torch.randn(1, 8), torch.tensor([i])) for i in range(4)]
    for flow in both(ao):
        _, converted = run(flow, model, calibration[0], quantizer, calibration)
        converted.get_buffer("cache").zero_()
        torch.manual_seed(1)
        results.append(torch.stack([converted(torch.randn(1, 8), torch.tensor([i])) for i in range(4)]))
    torch.testing.assert_close(results[0], results[1])


def test_quantization_tags_equal_torchao(ao):
    x = torch.randn(3, 8)
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    cases = [
        (TwoLinears().eval(), OneOp(aten.linear.default, spec=dynamic, tag="dyn")),
        (model, OneOp(aten.linear.default, spec=int8, output=int8, tag="static")),
    ]
    for net, make in cases:
        tags = []
        for flow in both(ao):
            _, converted = run(flow, net, (x,), make)
            created = [n for n in converted.graph.nodes if "quantized_decomposed" in str(n.target)]
            tags.append(sorted((str(n.target), str(n.meta.get("quantization_tag"))) for n in created))
        assert tags[0] == tags[1]


def test_affine_observer_converts_itself_as_in_torchao(ao):
    from torchao.quantization.pt2e._affine_quantization import AffineQuantizedMinMaxObserver
    from torchao.quantization.pt2e.observer import MappingType, PerToken

    def spec(api):
        return api.quantizer.QuantizationSpec(
            dtype=torch.uint8,
            quant_min=0,
            quant_max=255,
            qscheme=None,
            observer_or_fake_quant_ctr=AffineQuantizedMinMaxObserver.with_args(
                target_dtype=torch.uint8, mapping_type=MappingType.SYMMETRIC, granularity=PerToken()
            ),
        )

    model, x = torch.nn.Linear(8, 4).eval(), torch.randn(3, 8)
    outs = []
    for flow in both(ao):
        _, converted = run(flow, model, (x,), OneOp(aten.linear.default, spec=spec))
        assert any("torchao.quantize_affine" in str(n.target) for n in converted.graph.nodes)
        outs.append(converted(x))
    torch.testing.assert_close(outs[0], outs[1])


def test_qat_convert_after_torchaos_move_to_eval(ao):
    torch.manual_seed(0)
    prepared = qw.prepare_qat_pt2e(
        torch.export.export(ConvBn().train(), (torch.randn(2, 3, 8, 8),)).module(), ConvBnQATQuantizer()
    )
    for _ in range(3):
        prepared(torch.randn(2, 3, 8, 8))
    ao.move_to_eval(prepared)
    converted = qw.convert_pt2e(prepared)
    assert not [n for n in converted.graph.nodes if "batch_norm" in str(n.target)]


def test_eval_and_train_raise_in_both(ao):
    model, x = TwoLinears().eval(), torch.randn(3, 8)
    for flow in both(ao):
        prepared, converted = run(flow, model, (x,), OneOp(aten.linear.default, spec=int8))
        for gm in (prepared, converted):
            with pytest.raises(NotImplementedError):
                gm.eval()
            with pytest.raises(NotImplementedError):
                gm.train()


# -- prepare: batch-norm folding, control flow


def test_bn_folding_coverage_equals_torchao(ao):
    torch.manual_seed(0)
    padded, chunked = PaddedConvBn().eval(), ChunkedConvBn().eval()
    randomise_bn(padded.bn)
    randomise_bn(chunked.bn)
    linear3d = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.BatchNorm1d(5)).eval()
    cases = [
        (padded, (torch.randn(1, 3, 8, 8),), aten.conv2d.padding),
        (chunked, (torch.rand(1, 3, 8, 8),), aten.conv2d.default),
        (linear3d, (torch.randn(2, 5, 3),), aten.linear.default),
    ]
    for model, inputs, target in cases:
        seen = []
        for flow in both(ao):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                prepared, _ = run(flow, model, inputs, OneOp(target, spec=int8))
            unfused = [w for w in caught if "Not fusing linear+bn" in str(w.message)]
            bns = [n for n in prepared.graph.nodes if "batch_norm" in str(n.target)]
            assert all(n.meta for n in prepared.graph.nodes if n.op != "output")
            seen.append((len(bns), bool(unfused)))
        assert seen[0] == seen[1], (model, seen)


def test_scan_body_quantized_as_in_torchao(ao):
    torch.manual_seed(0)
    model, inputs = ScanLinear().eval(), (torch.randn(3, 5), torch.zeros(5))
    outs = []
    for _, api, prepare, convert in both(ao):
        prepared = prepare(
            torch.export.export(copy.deepcopy(model), inputs).module(),
            OneOp(aten.linear.default, spec=int8, output=int8)(api),
        )
        with torch.no_grad():
            prepared(*inputs)
        converted = convert(prepared)
        outs.append(converted(*inputs))
    torch.testing.assert_close(outs[0], outs[1])


# -- reference representation


def test_reference_representation_close_to_torchaos(ao):
    from quantweave.testing.reference import make_reference_quantizer, quantweave_api, torchao_api

    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 10, 10), torch.randn(2, 4, 4, 4))
    results, model = [], RefNet().eval()
    for api, prepare, convert in (
        (quantweave_api(), qw.prepare_pt2e, qw.convert_pt2e),
        (torchao_api(), ao.prepare, ao.convert),
    ):
        prepared = prepare(export(copy.deepcopy(model), *inputs), make_reference_quantizer(api))
        prepared(*inputs)
        qdq = convert(copy.deepcopy(prepared))
        reference = convert(prepared, use_reference_representation=True)
        results.append((qdq(*inputs), reference(*inputs)))
    (our_qdq, ours), (their_qdq, theirs) = results
    assert torch.equal(our_qdq, their_qdq)
    step = (our_qdq - ours).abs().max()
    assert step <= (their_qdq - theirs).abs().max() + 1e-6 or torch.allclose(ours, theirs, atol=0.05)


# -- documented differences


def test_uncalibrated_activation_observer(ao):
    """Documented difference 'uncalibrated observer': torchao converts it (qparams of an empty
    range); quantweave raises ObserverNotCalibratedError naming it."""
    model, x = TwoLinears().eval(), torch.randn(3, 8)
    for name, api, prepare, convert in both(ao):
        prepared = prepare(export(copy.deepcopy(model), x), OneOp(aten.linear.default, spec=int8)(api))
        if name == "torchao":
            convert(prepared)
        else:
            with pytest.raises(qw.errors.ObserverNotCalibratedError, match="activation_post_process"):
                convert(prepared)


def test_callers_graph_is_not_mutated(ao):
    """Documented difference 'caller's graph': torchao's prepare_pt2e rewrites the exported
    module it is given; quantweave's leaves it as it was."""
    model, x = TwoLinears().eval(), torch.randn(3, 8)
    for name, api, prepare, _ in both(ao):
        exported = export(copy.deepcopy(model), x)
        before = [n.format_node() for n in exported.graph.nodes]
        prepare(exported, OneOp(aten.linear.default, spec=int8)(api))
        after = [n.format_node() for n in exported.graph.nodes]
        assert (before == after) is (name == "quantweave")

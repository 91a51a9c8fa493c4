"""Hosting quantizers written against torchao's PT2E API (issue #21), without torchao.

The "foreign" classes below are minimal stand-ins named like torchao's
(``torchao.quantization.pt2e.quantizer`` / ``.observer``), unrelated to quantweave's and
torch.ao's classes: a quantizer using them proves that prepare translates annotations and
specs by their fields, and that calibrate / convert recognise observers by protocol.
The reference quantizer (written once against an API namespace) runs on the foreign names
and on quantweave's: both flows must give the same q/dq decisions and identical outputs.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch.fx import Node

import quantweave as qw
from quantweave.authoring import annotate_output_qspec
from quantweave.convert import dequantize_ops, quantize_ops
from quantweave.observers import is_observer_module
from quantweave.plugin_api import ANNOTATED_BY_KEY
from quantweave.testing import models
from quantweave.testing.inspect import qdq_summary
from quantweave.testing.reference import make_reference_quantizer, quantweave_api
from tests.helpers import assert_names, export, share_through_a_missing_edge

aten = torch.ops.aten
KEY = "quantization_annotation"


# -- the foreign API: named like torchao's, no relation to quantweave's or torch.ao's classes


class QuantizationSpecBase:
    pass


@dataclasses.dataclass(eq=True, frozen=True)
class QuantizationSpec(QuantizationSpecBase):
    dtype: torch.dtype
    observer_or_fake_quant_ctr: Any
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: Any = None
    ch_axis: int | None = None
    is_dynamic: bool = False


@dataclasses.dataclass(eq=True, frozen=True)
class FixedQParamsQuantizationSpec(QuantizationSpecBase):
    dtype: torch.dtype
    scale: float
    zero_point: int
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: Any = None
    is_dynamic: bool = False


@dataclasses.dataclass(eq=True, frozen=True)
class SharedQuantizationSpec(QuantizationSpecBase):
    edge_or_node: Any


@dataclasses.dataclass(eq=True, frozen=True)
class DerivedQuantizationSpec(QuantizationSpecBase):
    derived_from: list
    derive_qparams_fn: Any
    dtype: torch.dtype
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: Any = None
    ch_axis: int | None = None
    is_dynamic: bool = False


@dataclasses.dataclass
class QuantizationAnnotation:
    input_qspec_map: dict = dataclasses.field(default_factory=dict)
    output_qspec: Any = None
    allow_implicit_sharing: bool = True
    _annotated: bool = False


class Quantizer:
    """torchao's Quantizer hooks, not a quantweave.Quantizer."""

    def transform_for_annotation(self, model):
        return model

    def annotate(self, model):
        raise NotImplementedError

    def validate(self, model):
        return None

    def prepare_obs_or_fq_callback(self, model, edge_or_node_to_obs_or_fq):
        return None


def _foreign_observer(torch_cls: type) -> type:
    """An observer with torch's statistics and qparams, outside torch.ao's hierarchy (as
    torchao's observers are): a plain nn.Module with the observer protocol."""

    class Observer(nn.Module):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__()
            self.impl = torch_cls(**kwargs)

        def forward(self, x):
            return self.impl(x)

        def calculate_qparams(self):
            return self.impl.calculate_qparams()

        @classmethod
        def with_args(cls, **kwargs):
            return functools.partial(cls, **kwargs)

    for name in ("dtype", "qscheme", "quant_min", "quant_max", "ch_axis", "is_dynamic", "eps", "min_val", "max_val"):
        setattr(Observer, name, property(lambda self, n=name: getattr(self.impl, n)))
    Observer.__name__ = Observer.__qualname__ = torch_cls.__name__
    return Observer


MinMaxObserver = _foreign_observer(torch.ao.quantization.MinMaxObserver)
HistogramObserver = _foreign_observer(torch.ao.quantization.HistogramObserver)
PerChannelMinMaxObserver = _foreign_observer(torch.ao.quantization.PerChannelMinMaxObserver)
PlaceholderObserver = _foreign_observer(torch.ao.quantization.PlaceholderObserver)

FOREIGN = types.SimpleNamespace(
    QuantizationSpec=QuantizationSpec,
    SharedQuantizationSpec=SharedQuantizationSpec,
    FixedQParamsQuantizationSpec=FixedQParamsQuantizationSpec,
    DerivedQuantizationSpec=DerivedQuantizationSpec,
    QuantizationAnnotation=QuantizationAnnotation,
    Quantizer=Quantizer,
    MinMaxObserver=MinMaxObserver,
    HistogramObserver=HistogramObserver,
    PerChannelMinMaxObserver=PerChannelMinMaxObserver,
)


class FnQuantizer(Quantizer):
    def __init__(self, fn):
        self.fn = fn

    def annotate(self, model):
        self.fn(model)
        return model


# -- models


class ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _conv_bn_relu():
    model = ConvBnRelu().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(2, 3, 16, 16),)


MODELS = {
    "conv_bn_relu": _conv_bn_relu,
    "mlp": lambda: (MLP().eval(), (torch.randn(4, 16),)),
    "attention": lambda: (models.encoder_block().eval(), (torch.randn(2, 8, 64),)),
    "resnet_like": lambda: (models.resnet18_like(width=8, num_classes=10).eval(), (torch.randn(1, 3, 32, 32),)),
}


def run(model, inputs, quantizer):
    prepared = qw.prepare_pt2e(export(model, *inputs), quantizer)
    for scale in (1.0, 0.5, 2.0):
        prepared(*(x * scale for x in inputs))
    converted = qw.convert_pt2e(prepared)
    return prepared, converted, converted(*inputs)


def qdq_count(gm):
    ops = (*quantize_ops(), *dequantize_ops())
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in ops)


@pytest.mark.parametrize("options", [{}, {"derived_bias": True}, {"histogram": True}], ids=["plain", "bias", "hist"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_quantizer_written_with_foreign_classes_converts_like_a_native_one(name, options):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    native = run(model, inputs, make_reference_quantizer(quantweave_api(), **options))
    foreign = run(model, inputs, make_reference_quantizer(FOREIGN, **options))
    assert not isinstance(make_reference_quantizer(FOREIGN), qw.Quantizer)
    # prepare left quantweave's annotations and the foreign observers in the graph
    annotations = [n.meta[KEY] for n in foreign[0].graph.nodes if KEY in n.meta]
    assert annotations and all(isinstance(a, qw.QuantizationAnnotation) for a in annotations)
    observers = [m for m in foreign[0].modules() if type(m).__module__ == __name__]
    assert observers and all(is_observer_module(m) and not isinstance(m, qw.observers.ObserverBase) for m in observers)
    assert qdq_count(foreign[1]) == qdq_count(native[1]) > 0
    assert qdq_summary(foreign[1]) == qdq_summary(native[1])
    assert torch.equal(foreign[2], native[2]), f"max abs difference {(foreign[2] - native[2]).abs().max()}"


def test_calibrate_counts_foreign_observers():
    model, inputs = MODELS["mlp"]()
    prepared = qw.prepare_pt2e(export(model, *inputs), make_reference_quantizer(FOREIGN))
    result = qw.calibrate(prepared, [inputs])
    assert result.observers > 0 and result.observed == result.observers
    qw.convert_pt2e(prepared)


def test_an_uncalibrated_foreign_observer_is_named_by_convert():
    model, inputs = MODELS["mlp"]()
    prepared = qw.prepare_pt2e(export(model, *inputs), make_reference_quantizer(FOREIGN))
    with pytest.raises(qw.ObserverNotCalibratedError) as info:
        qw.convert_pt2e(prepared)
    assert_names(info, "activation_post_process_", "'x'")


def _act(**kwargs):
    return QuantizationSpec(
        dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver, qscheme=torch.per_tensor_affine, **kwargs
    )


def _linear(gm):
    return next(n for n in gm.graph.nodes if n.target == aten.linear.default)


def _prepare_mlp(fn):
    model, inputs = MODELS["mlp"]()
    return qw.prepare_pt2e(export(model, *inputs), FnQuantizer(fn)), inputs


def test_a_float_bias_spec_is_left_float_and_a_per_channel_axis_comes_from_the_observer():
    def fn(gm):
        linear = _linear(gm)
        x, w, b = linear.args
        weight = QuantizationSpec(
            dtype=torch.qint8,  # torch's quantized dtype: the int8 it stands for
            observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(ch_axis=0),
            qscheme=torch.per_channel_symmetric,
            ch_axis=None,  # taken from the observer's keyword
        )
        bias = QuantizationSpec(dtype=torch.float, observer_or_fake_quant_ctr=PlaceholderObserver)
        linear.meta[KEY] = QuantizationAnnotation(
            input_qspec_map={x: _act(), w: weight, b: bias}, output_qspec=SharedQuantizationSpec((x, linear))
        )

    prepared, inputs = _prepare_mlp(fn)
    linear = _linear(prepared)
    annotation = linear.meta[KEY]
    _, w, b = (arg.args[0] if arg.op == "call_module" else arg for arg in linear.args)
    assert annotation.input_qspec_map[b] is None
    assert annotation.input_qspec_map[w].dtype == torch.int8 and annotation.input_qspec_map[w].ch_axis == 0
    prepared(*inputs)
    converted = qw.convert_pt2e(prepared)
    dq = [n for n in converted.graph.nodes if "dequantize_per_channel" in str(n.target)]
    assert len(dq) == 1 and dq[0].args[3] == 0


def test_fixed_and_derived_specs_with_tensor_qparams_translate():
    def derive(observers):
        act_scale, _ = observers[0].calculate_qparams()  # a foreign observer, as torchao's bias derivations do
        weight_scale, _ = observers[1].calculate_qparams()
        scale = (act_scale * weight_scale).float()
        return scale, torch.zeros_like(scale, dtype=torch.int64)

    def fn(gm):
        linear = _linear(gm)
        x, w, b = linear.args
        bias = DerivedQuantizationSpec(
            derived_from=[(x, linear), (w, linear)],
            derive_qparams_fn=derive,
            dtype=torch.int32,
            quant_min=-(2**31),
            quant_max=2**31 - 1,
            qscheme=torch.per_tensor_symmetric,
        )
        linear.meta[KEY] = QuantizationAnnotation(input_qspec_map={x: _act(), w: _act(), b: bias}, _annotated=True)
        relu = next(iter(linear.users))
        relu.meta[KEY] = QuantizationAnnotation(
            output_qspec=FixedQParamsQuantizationSpec(
                dtype=torch.uint8, scale=torch.tensor(1.0 / 256), zero_point=torch.tensor(0), quant_min=0, quant_max=255
            )
        )

    prepared, inputs = _prepare_mlp(fn)
    assert all(isinstance(n.meta.get(KEY), (qw.QuantizationAnnotation, type(None))) for n in prepared.graph.nodes)
    assert _linear(prepared).meta[KEY]._annotated
    prepared(*inputs)
    converted = qw.convert_pt2e(prepared)
    scales = {n.args[1] for n in converted.graph.nodes if "dequantize_per_tensor" in str(n.target)}
    assert 1.0 / 256 in scales
    assert any(n.args[-1] == torch.int32 for n in converted.graph.nodes if "dequantize" in str(n.target))


def test_a_spec_quantweave_cannot_take_names_the_edge_the_class_and_the_quantizer():
    def fn(gm):
        linear = _linear(gm)
        spec = QuantizationSpec(dtype=torch.float64, observer_or_fake_quant_ctr=PlaceholderObserver)
        linear.meta[KEY] = QuantizationAnnotation(input_qspec_map={linear.args[0]: spec})

    with pytest.raises(qw.AnnotationError) as info:
        _prepare_mlp(fn)
    assert_names(info, "'x'", "'linear'", "'FnQuantizer'", "test_hosting.QuantizationSpec", "float64")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_placeholder_spec_translates_like_the_native_one(dtype):
    """torchao's float16 / bfloat16 specs mean what quantweave's own do (issue #29)."""
    outputs = []
    for api in (None, qw):
        spec_cls = QuantizationSpec if api is None else qw.QuantizationSpec

        def fn(gm, spec_cls=spec_cls, api=api):
            linear = _linear(gm)
            spec = spec_cls(dtype=dtype, observer_or_fake_quant_ctr=torch.ao.quantization.PlaceholderObserver)
            annotation = QuantizationAnnotation if api is None else qw.QuantizationAnnotation
            linear.meta[KEY] = annotation(input_qspec_map={linear.args[0]: spec})

        torch.manual_seed(0)  # the same model and inputs for both
        prepared, inputs = _prepare_mlp(fn)
        prepared(*inputs)
        outputs.append(qw.convert_pt2e(prepared)(*inputs))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_an_object_that_is_not_a_spec_is_named():
    def fn(gm):
        linear = _linear(gm)
        linear.meta[KEY] = QuantizationAnnotation(output_qspec=object())

    with pytest.raises(qw.AnnotationError) as info:
        _prepare_mlp(fn)
    assert_names(info, "output of 'linear'", "object", "'FnQuantizer'")


class AffineObserver(nn.Module):
    """Like torchao's affine observers: qparams, but no dtype; converts itself."""

    converted: ClassVar[list[str]] = []

    def __init__(self, **kwargs):
        super().__init__()

    def forward(self, x):
        return x

    def calculate_qparams(self):
        return torch.tensor(1.0), torch.tensor(0)

    def convert(self, model, observer_node):
        AffineObserver.converted.append(observer_node.args[0].name)
        observer_node.replace_all_uses_with(observer_node.args[0])
        model.graph.erase_node(observer_node)


class NoQParams(nn.Module):
    def __init__(self, dtype=torch.int8, **kwargs):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x


def _observe_linear_input(ctr):
    def fn(gm):
        linear = _linear(gm)
        spec = QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=ctr)
        linear.meta[KEY] = QuantizationAnnotation(input_qspec_map={linear.args[0]: spec})

    return fn


def test_an_observer_convert_would_not_recognise_is_rejected_at_prepare():
    with pytest.raises(qw.AnnotationError) as info:
        _prepare_mlp(_observe_linear_input(NoQParams))
    assert_names(info, "'x'", "'linear'", "'FnQuantizer'", "NoQParams", "calculate_qparams")


def test_an_observer_that_converts_itself_is_taken_and_its_convert_called():
    AffineObserver.converted.clear()
    prepared, inputs = _prepare_mlp(_observe_linear_input(AffineObserver))
    assert any(isinstance(m, AffineObserver) for m in prepared.modules())
    prepared(*inputs)
    converted = qw.convert_pt2e(prepared)
    assert AffineObserver.converted == ["x"]
    calls = [n for n in converted.graph.nodes if n.op == "call_module"]
    assert not any(isinstance(converted.get_submodule(str(n.target)), AffineObserver) for n in calls)


def test_an_observer_swapped_in_by_the_callback_is_checked_too():
    class Swap(FnQuantizer):
        def prepare_obs_or_fq_callback(self, model, observers):
            for key in observers:
                observers[key] = NoQParams()

    def fn(gm):
        linear = _linear(gm)
        linear.meta[KEY] = QuantizationAnnotation(input_qspec_map={linear.args[0]: _act()})

    model, inputs = MODELS["mlp"]()
    with pytest.raises(qw.AnnotationError) as info:
        qw.prepare_pt2e(export(model, *inputs), Swap(fn))
    assert_names(info, "'x'", "'linear'", "NoQParams")


# -- lenient input maps


def test_a_foreign_entry_for_a_node_that_is_not_an_input_is_dropped_as_torchao_does():
    def fn(gm):
        first, second = [n for n in gm.graph.nodes if n.target == aten.linear.default]
        second.meta[KEY] = QuantizationAnnotation(input_qspec_map={second.args[0]: _act(), first.args[0]: _act()})

    prepared, inputs = _prepare_mlp(fn)
    second = [n for n in prepared.graph.nodes if n.target == aten.linear.default][1]
    assert [p.name for p in second.meta[KEY].input_qspec_map] == ["relu"]
    prepared(*inputs)
    qw.convert_pt2e(prepared)


def test_a_native_none_entry_for_a_node_that_is_not_an_input_is_dropped():
    def fn(gm):
        first, second = [n for n in gm.graph.nodes if n.target == aten.linear.default]
        act = qw.QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=qw.observers.MinMaxObserver)
        second.meta[KEY] = qw.QuantizationAnnotation(input_qspec_map={second.args[0]: act, first.args[0]: None})

    prepared, _ = _prepare_mlp(fn)
    second = [n for n in prepared.graph.nodes if n.target == aten.linear.default][1]
    assert [p.name for p in second.meta[KEY].input_qspec_map] == ["relu"]


def test_a_shared_spec_naming_an_edge_that_does_not_exist_shares_its_group_as_torchao():
    model, inputs = MODELS["mlp"]()
    prepared = qw.prepare_pt2e(export(model, *inputs), share_through_a_missing_edge(FOREIGN))
    first, second = [n for n in prepared.graph.nodes if n.target == aten.linear.default]
    # the missing edge x -> linear_1 implicitly shares x -> linear's observer (same tensor, same spec), and
    # relu -> linear_1 shares the missing edge's group: one observer reads x and relu
    assert first.args[0].op == second.args[0].op == "call_module"
    assert first.args[0].target == second.args[0].target
    assert second.args[0].args[0].name == "relu"
    prepared(*inputs)
    assert qdq_count(qw.convert_pt2e(prepared)) == 4


def test_a_native_spec_for_a_node_that_is_not_an_input_is_named():
    def fn(gm):
        first, second = [n for n in gm.graph.nodes if n.target == aten.linear.default]
        act = qw.QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=qw.observers.MinMaxObserver)
        second.meta[KEY] = qw.QuantizationAnnotation(input_qspec_map={first.args[0]: act})

    with pytest.raises(qw.AnnotationError) as info:
        _prepare_mlp(fn)
    assert_names(info, "'linear_1'", "input_qspec_map", "'x'", "'FnQuantizer'")


# -- graph passes keep the metadata vendors read


class ReadsVal(Quantizer):
    """Reads meta['val'] of every input of every node, as ExecuTorch's XNNPACKQuantizer does
    of conv weights (``weight_node.meta["val"].shape``), then annotates nothing."""

    def annotate(self, model):
        for node in model.graph.nodes:
            for arg in node.all_input_nodes:
                if arg.op != "call_module":
                    assert "val" in arg.meta, arg.name
        return model


@pytest.mark.parametrize("name", ["conv_bn_relu", "mlp", "attention", "resnet_like"])
def test_every_node_prepare_makes_carries_meta_val(name):
    model, inputs = MODELS[name]()
    gm = export(model, *inputs)
    without = {n.name for n in gm.graph.nodes if "val" not in n.meta}  # export's own: output, _guards_fn
    assert without <= {"output", "_guards_fn"}
    qw.prepare_pt2e(gm, ReadsVal())  # the vendor reads them before any observer exists
    prepared = qw.prepare_pt2e(gm, make_reference_quantizer(FOREIGN, derived_bias=True))
    missing = [n.name for n in prepared.graph.nodes if "val" not in n.meta and n.name not in without]
    assert not missing
    folded = [n for n in prepared.graph.nodes if n.op == "get_attr" and n.name.startswith("_folded")]
    if name in ("conv_bn_relu", "resnet_like"):
        assert folded
        for node in folded:
            value = prepared.get_parameter(str(node.target))
            assert type(node.meta["val"]).__name__ == "FakeTensor"
            assert node.meta["val"].shape == value.shape and node.meta["val"].dtype == value.dtype
    for node in prepared.graph.nodes:
        if node.op == "call_module" and node.name.startswith("activation_post_process"):
            source = node.args[0]
            assert isinstance(source, Node)
            assert node.meta.get("stack_trace") == source.meta.get("stack_trace")


def test_translation_leaves_the_quantizer_and_callers_graph_alone():
    model, inputs = MODELS["mlp"]()
    gm = export(model, *inputs)
    quantizer = make_reference_quantizer(FOREIGN)
    seen = []

    class Keep(type(quantizer)):
        def annotate(self, model):
            super().annotate(model)
            seen.extend(n.meta[KEY] for n in model.graph.nodes if KEY in n.meta)
            return model

    qw.prepare_pt2e(gm, Keep())
    assert seen and all(type(a) is QuantizationAnnotation for a in seen)  # the vendor's objects, not replaced in place
    assert all(KEY not in n.meta for n in gm.graph.nodes)


# -- composition with vendors that re-annotate


def _relu(gm):
    return next(n for n in gm.graph.nodes if n.target == aten.relu.default)


def _claim_relu(annotated: bool):
    def fn(gm):
        relu = _relu(gm)
        if KEY not in relu.meta:
            relu.meta[KEY] = QuantizationAnnotation(output_qspec=_act(), _annotated=annotated)

    return fn


class Named(FnQuantizer):
    def __init__(self, name, fn):
        super().__init__(fn)
        self.name = name


def test_foreign_members_compose_first_annotator_wins():
    composed = qw.ComposableQuantizer([Named("vendor_a", _claim_relu(True)), Named("vendor_b", _claim_relu(True))])
    model, inputs = MODELS["mlp"]()
    prepared = qw.prepare_pt2e(export(model, *inputs), composed)
    relu = _relu(prepared)
    assert relu.meta[ANNOTATED_BY_KEY] == "vendor_a"
    assert isinstance(relu.meta[KEY], qw.QuantizationAnnotation)


class Rewrites(Quantizer):
    """Re-annotates the relu an earlier member annotated, as Arm's / Samsung's quantizers do."""

    name = "rewriter"

    def __init__(self, how):
        self.how = how

    def annotate(self, model):
        relu = _relu(model)
        if self.how == "mutate":
            relu.meta[KEY].output_qspec = _act(quant_min=-100, quant_max=100)
        elif self.how == "input":
            relu.meta[KEY].input_qspec_map[relu.args[0]] = _act()
        else:
            relu.meta[KEY] = QuantizationAnnotation(output_qspec=SharedQuantizationSpec(relu.args[0]))
        return model


@pytest.mark.parametrize(
    ("how", "change"),
    [
        (
            "mutate",
            r"output spec: QuantizationSpec\(torch.int8, .*MinMaxObserver\) -> QuantizationSpec\(.*quant_min=-100",
        ),
        ("input", r"input edge from 'linear' added: QuantizationSpec\(torch.int8"),
        ("replace", r"output spec: QuantizationSpec\(.*\) -> SharedQuantizationSpec\('linear'\)"),
    ],
)
def test_a_vendor_rewriting_an_earlier_annotation_is_named_with_what_it_changed(how, change):
    composed = qw.ComposableQuantizer([Named("vendor_a", _claim_relu(True)), Rewrites(how)])
    model, inputs = MODELS["mlp"]()
    # the later member, the earlier one, the node and the change, in that order (who changed whose)
    with pytest.raises(qw.AnnotationConflictError, match=rf"'rewriter'.*'vendor_a'.*node 'relu'.*{change}"):
        qw.prepare_pt2e(export(model, *inputs), composed)


def test_a_vendor_leaving_annotated_unset_is_named_with_the_order_that_composes():
    # OpenVINO's quantizer leaves _annotated unset: a later member cannot know the node is taken
    composed = qw.ComposableQuantizer([Named("openvino_like", _claim_relu(False)), Rewrites("replace")])
    model, inputs = MODELS["mlp"]()
    with pytest.raises(qw.AnnotationConflictError) as info:
        qw.prepare_pt2e(export(model, *inputs), composed)
    assert_names(info, "_annotated", "'rewriter'", "'openvino_like'")
    reordered = qw.ComposableQuantizer([Named("other", lambda gm: None), Named("openvino_like", _claim_relu(False))])
    prepared = qw.prepare_pt2e(export(model, *inputs), reordered)
    prepared(*inputs)
    qw.convert_pt2e(prepared)


class NativeRelu(qw.Quantizer):
    """A quantweave quantizer that annotates the relu with quantweave's helpers."""

    name = "native"

    def annotate(self, model):
        annotate_output_qspec(
            _relu(model), qw.QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver)
        )
        return model

    def validate(self, model):
        pass


def test_a_native_member_after_a_vendor_leaving_annotated_unset_gets_the_order_that_composes():
    # the vendor's annotations are translated after its annotate: the next member reads quantweave's
    # classes (not a TypeError about torchao's class) and its change is named as a conflict
    composed = qw.ComposableQuantizer([Named("openvino_like", _claim_relu(False)), NativeRelu()])
    model, inputs = MODELS["mlp"]()
    with pytest.raises(qw.AnnotationConflictError) as info:
        qw.prepare_pt2e(export(model, *inputs), composed)
    assert_names(info, "_annotated", "'native'", "'openvino_like'")
    prepared = qw.prepare_pt2e(export(model, *inputs), qw.ComposableQuantizer([NativeRelu(), composed.quantizers[0]]))
    assert _relu(prepared).meta[ANNOTATED_BY_KEY] == "native"


def test_a_foreign_quantizer_composes_with_a_native_one_and_leave_float_wraps_it():
    model, inputs = MODELS["mlp"]()
    composed = qw.ComposableQuantizer([Named("vendor", _claim_relu(True)), make_reference_quantizer()])
    prepared = qw.prepare_pt2e(export(model, *inputs), composed)
    prepared(*inputs)
    converted = qw.convert_pt2e(prepared)
    assert qdq_count(converted) > 0
    wrapped = qw.LeaveFloat(make_reference_quantizer(FOREIGN), nodes=["linear_1"])
    prepared = qw.prepare_pt2e(export(model, *inputs), wrapped)
    second = [n for n in prepared.graph.nodes if n.target == aten.linear.default][1]
    assert KEY not in second.meta or not any(second.meta[KEY].input_qspec_map.values())


def test_annotation_report_reads_a_graph_a_hosted_quantizer_annotated():
    model, inputs = MODELS["mlp"]()
    gm = export(model, *inputs)
    quantizer = make_reference_quantizer(FOREIGN)
    quantizer.annotate(gm)  # torchao's classes on the graph, no prepare
    report = qw.annotation_report(gm, quantizer)
    assert {row.node for row in report.nodes if row.status == "quantized"} >= {"linear", "linear_1"}


def test_fallback_takes_a_hosted_quantizer_and_leave_float_derives_its_capabilities():
    hosted = make_reference_quantizer(FOREIGN)  # declares no capabilities
    caps = qw.LeaveFloat(hosted, nodes=[]).quantization_capabilities()
    assert caps and {c.source for c in caps} == {"derived"}
    torch.manual_seed(0)
    model, inputs = MODELS["mlp"]()
    result = qw.fallback(export(model, *inputs), hosted, [inputs], lambda m: 1.0, max_drop=0.01)
    assert result.met

"""The bad-input corpus (issue #16): malformed annotations, quantizers that raise in each
hook, and awkward models. Each case ends in a clear error (the exact class, naming the
node, edge, option or quantizer) or a correct result, and nothing of the caller's is lost:
the exported model (graph, node meta, parameters and buffers) and the inputs are as they
were.

What quantweave guarantees for what it does not own: ``torch.export`` failing on an
untraceable model raises torch's own error (quantweave is not involved yet); handing
``prepare_pt2e`` anything but the ``GraphModule`` of ``torch.export.export(...).module()``
(the ``nn.Module`` itself, the ``ExportedProgram``) raises ``TypeError`` naming what it got.
An exception raised by a quantizer's own hook keeps its class (a ``validate`` that rejects
a model with ``ValueError`` still raises ``ValueError``) and carries a note naming the
quantizer (and, in a composition, the member) and the hook.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, annotate_output_qspec
from quantweave.observers import MinMaxObserver
from quantweave.plugin_api import mark_annotated
from tests.helpers import Caller, Snapshot, SplitConvLinear, assert_names

aten = torch.ops.aten
KEY = "quantization_annotation"
ACT = qw.QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=MinMaxObserver)


class FnQuantizer(qw.Quantizer):
    """Annotates with a function; ``raises`` maps a hook name to the exception it raises."""

    name = "corpus"

    def __init__(self, fn: Callable[[GraphModule], None] | None = None, raises: dict[str, Exception] | None = None):
        self.fn = fn
        self.raises = raises or {}

    def _maybe_raise(self, hook: str) -> None:
        if hook in self.raises:
            raise self.raises[hook]

    def transform_for_annotation(self, model):
        self._maybe_raise("transform_for_annotation")
        return model

    def annotate(self, model):
        self._maybe_raise("annotate")
        if self.fn is not None:
            self.fn(model)
        return model

    def validate(self, model):
        self._maybe_raise("validate")

    def prepare_obs_or_fq_callback(self, model, edge_or_node_to_obs_or_fq):
        self._maybe_raise("prepare_obs_or_fq_callback")

    def quantization_capabilities(self):
        self._maybe_raise("quantization_capabilities")
        return ()


def _export(model: torch.nn.Module, *args: torch.Tensor, **kwargs: Any) -> GraphModule:
    return torch.export.export(model.eval(), args, **kwargs).module()


def _node(gm: GraphModule, target: Any) -> Node:
    return next(n for n in gm.graph.nodes if n.target == target)


# -- malformed annotations --------------------------------------------------------------------


def _annotate_conv_input(spec: Any) -> Callable[[GraphModule], None]:
    def fn(gm):
        conv = _node(gm, aten.conv2d.default)
        conv.meta[KEY] = qw.QuantizationAnnotation(input_qspec_map={conv.args[0]: spec})

    return fn


def _wrong_annotation_type(gm):
    _node(gm, aten.conv2d.default).meta[KEY] = {"input_qspec_map": {}}


def _output_spec_of_wrong_type(gm):
    _node(gm, aten.linear.default).meta[KEY] = qw.QuantizationAnnotation(output_qspec="uint8")


def _key_not_an_input(gm):
    conv, linear = _node(gm, aten.conv2d.default), _node(gm, aten.linear.default)
    linear.meta[KEY] = qw.QuantizationAnnotation(input_qspec_map={conv: ACT})


def _key_not_a_node(gm):
    _node(gm, aten.conv2d.default).meta[KEY] = qw.QuantizationAnnotation(input_qspec_map={"x": ACT})


def _spec_on_a_list_output(gm):  # split_with_sizes returns a list of tensors
    annotate_output_qspec(_node(gm, aten.split_with_sizes.default), ACT)


def _spec_on_an_int_input(gm):
    embedding = _node(gm, aten.embedding.default)
    annotate_input_qspec_map(embedding, embedding.args[1], ACT)


def _shared_with_an_erased_node(gm):
    conv = _node(gm, aten.conv2d.default)
    with gm.graph.inserting_before(conv):
        ghost = gm.graph.call_function(aten.relu.default, (conv.args[0],))
    gm.graph.erase_node(ghost)
    annotate_input_qspec_map(conv, conv.args[0], qw.SharedQuantizationSpec(ghost))


def _shared_with_a_node_of_another_graph(gm):
    other = _export(SplitConvLinear(), torch.randn(1, 3, 8, 8))
    conv = _node(gm, aten.conv2d.default)
    annotate_input_qspec_map(conv, conv.args[0], qw.SharedQuantizationSpec(_node(other, aten.conv2d.default)))


def _shared_with_an_unannotated_edge(gm):
    conv, relu = _node(gm, aten.conv2d.default), _node(gm, aten.relu.default)
    annotate_input_qspec_map(relu, conv, qw.SharedQuantizationSpec((conv.args[0], conv)))


def _cyclic_shared(gm):
    conv, relu = _node(gm, aten.conv2d.default), _node(gm, aten.relu.default)
    annotate_output_qspec(conv, qw.SharedQuantizationSpec(relu))
    annotate_output_qspec(relu, qw.SharedQuantizationSpec(conv))


def _cyclic_derived(gm):
    conv, relu = _node(gm, aten.conv2d.default), _node(gm, aten.relu.default)

    def derive(observers):
        return torch.tensor([1.0]), torch.tensor([0])

    annotate_output_qspec(conv, qw.DerivedQuantizationSpec([relu], derive, torch.int32))
    annotate_output_qspec(relu, qw.DerivedQuantizationSpec([conv], derive, torch.int32))


def _observer_that_cannot_be_built(gm):
    conv = _node(gm, aten.conv2d.default)

    def ctr(**kwargs):
        raise RuntimeError("no such observer")

    annotate_input_qspec_map(conv, conv.args[0], qw.QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=ctr))


#: (case, annotate, exception class, regex the message must match: it names the node/edge)
PREPARE_ERRORS = [
    ("annotation of a wrong type", _wrong_annotation_type, qw.AnnotationError, r"node 'conv2d'.*got dict"),
    ("input spec of a wrong type", _annotate_conv_input("uint8"), qw.AnnotationError, r"edge 'x' -> 'conv2d'.*got str"),
    (
        "input spec that is a QuantizationConfig",
        _annotate_conv_input(qw.QuantizationConfig(ACT, ACT, None, None)),
        qw.AnnotationError,
        r"edge 'x' -> 'conv2d'.*got QuantizationConfig",
    ),
    ("output spec of a wrong type", _output_spec_of_wrong_type, qw.AnnotationError, r"output of 'linear'.*got str"),
    (
        "input key that is not an input",
        _key_not_an_input,
        qw.AnnotationError,
        r"node 'linear'.*'conv2d'.*not one of.*\['mean', 'linear_weight', 'linear_bias'\].*corpus",
    ),
    (
        "input key that is not a node",
        _key_not_a_node,
        qw.AnnotationError,
        r"node 'conv2d'.*'x'.*not one of.*\['x', 'conv_weight', 'conv_bias'\]",
    ),
    (
        "spec on a list output",
        _spec_on_a_list_output,
        qw.AnnotationError,
        r"'split_with_sizes'.*corpus.*list.*not a tensor.*float32",
    ),
    ("shared with an erased node", _shared_with_an_erased_node, qw.SharingError, r"edge 'x' -> 'conv2d'.*'relu"),
    ("shared with another graph", _shared_with_a_node_of_another_graph, qw.SharingError, r"edge 'x' -> 'conv2d'"),
    ("shared with an unannotated edge", _shared_with_an_unannotated_edge, qw.SharingError, r"'conv2d' -> 'relu'"),
    ("cyclic shared specs", _cyclic_shared, qw.SharingError, r"output of 'conv2d'.*output of 'relu'"),
    ("cyclic derived specs", _cyclic_derived, qw.SharingError, r"cyclic DerivedQuantizationSpec.*'conv2d'.*'relu'"),
    (
        "observer that cannot be built",
        _observer_that_cannot_be_built,
        qw.AnnotationError,
        r"'conv2d'.*no such observer",
    ),
]


@pytest.mark.parametrize(("case", "annotate", "error", "message"), PREPARE_ERRORS, ids=[c[0] for c in PREPARE_ERRORS])
def test_malformed_annotation_raises_naming_the_node(case, annotate, error, message):
    caller = Caller()
    with pytest.raises(error, match=message) as info:
        qw.prepare_pt2e(caller.gm, FnQuantizer(annotate))
    assert type(info.value) is error, f"{case}: raised {type(info.value).__name__}, expected exactly {error.__name__}"
    caller.assert_untouched()


def test_spec_on_an_integer_input_raises_naming_the_edge_and_dtype():
    caller = Caller(torch.nn.Embedding(10, 4), torch.randint(0, 10, (2, 3)))
    with pytest.raises(qw.AnnotationError) as info:
        qw.prepare_pt2e(caller.gm, FnQuantizer(_spec_on_an_int_input))
    assert_names(info, "'embedding'", "'corpus'", "torch.int64")
    assert type(info.value) is qw.AnnotationError
    caller.assert_untouched()


def test_spec_on_a_symbolic_size_raises_naming_the_edge():
    class Reshape(torch.nn.Module):
        def forward(self, x):
            return x.reshape(x.shape[0], -1)

    batch = torch.export.Dim("batch", min=2)
    caller = Caller(Reshape(), torch.randn(2, 3, 4), dynamic_shapes=({0: batch},))

    def annotate(gm):
        reshape = _node(gm, aten.reshape.default)
        size = next(n for n in reshape.all_input_nodes if n.target == aten.sym_size.int)
        annotate_input_qspec_map(reshape, size, ACT)

    with pytest.raises(qw.AnnotationError) as info:
        qw.prepare_pt2e(caller.gm, FnQuantizer(annotate))
    assert_names(info, "'reshape'", "SymInt", "not a tensor")
    caller.assert_untouched()


# -- derived and fixed specs with bad qparams -------------------------------------------------


def _derived_output(derive: Callable[[list[Any]], Any]) -> Callable[[GraphModule], None]:
    def fn(gm):
        linear = _node(gm, aten.linear.default)
        annotate_input_qspec_map(linear, linear.args[0], ACT)
        annotate_output_qspec(
            linear, qw.DerivedQuantizationSpec([(linear.args[0], linear)], derive, torch.uint8, 0, 255)
        )

    return fn


def _raises(observers):
    raise ZeroDivisionError("the derivation divides by zero")


def _negative(observers):
    return torch.tensor([-0.5]), torch.tensor([0])


def _zero(observers):
    return torch.tensor([0.0]), torch.tensor([0])


def _nan(observers):
    return torch.tensor([float("nan")]), torch.tensor([0])


@pytest.mark.parametrize(
    ("derive", "message"),
    [
        # the observer, the node it observes, what failed / the field, what was expected, the value got
        (_raises, r"activation_post_process_\d+.*'linear'.*ZeroDivisionError: the derivation divides by zero"),
        (_negative, r"activation_post_process_\d+.*'linear'.*scale.*positive and finite.*-0\.5"),
        (_zero, r"activation_post_process_\d+.*'linear'.*scale.*positive and finite.*tensor\(\[0\."),
        (_nan, r"activation_post_process_\d+.*'linear'.*scale.*positive and finite.*nan"),
    ],
    ids=["raises", "negative scale", "zero scale", "nan scale"],
)
def test_derived_spec_with_a_failing_function_raises_convert_error_naming_the_node(derive, message):
    caller = Caller()
    prepared = qw.prepare_pt2e(caller.gm, FnQuantizer(_derived_output(derive)))
    prepared(*caller.inputs)
    prepared_snapshot = Snapshot.of(prepared)
    with pytest.raises(qw.ConvertError, match=message):
        qw.convert_pt2e(prepared)
    assert prepared_snapshot.differences(prepared) == []
    caller.assert_untouched()


def test_a_model_computing_nan_during_calibration_fails_at_convert_naming_the_observer():
    """Garbage in: a float model whose activations are NaN. convert_pt2e raises
    ObserverNotCalibratedError naming the observer, the node, and that it saw only NaN / inf
    (a histogram observer raises torch.histc's RuntimeError during calibration already)."""

    class Nan(torch.nn.Module):
        def forward(self, x):
            return torch.log(x - 10)  # NaN for every x < 10

    caller = Caller(Nan(), torch.randn(2, 4))

    def annotate(gm):
        annotate_output_qspec(_node(gm, aten.log.default), ACT)

    prepared = qw.prepare_pt2e(caller.gm, FnQuantizer(annotate))
    prepared(*caller.inputs)
    with pytest.raises(qw.ObserverNotCalibratedError) as info:
        qw.convert_pt2e(prepared)
    assert_names(info, "'log'", "NaN / inf")
    caller.assert_untouched()


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan"), "1"])
def test_fixed_spec_with_a_bad_scale_is_rejected_on_construction(scale):
    with pytest.raises(ValueError) as info:
        qw.FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=scale, zero_point=0)
    assert_names(info, "FixedQParamsQuantizationSpec", "scale", "positive")


@pytest.mark.parametrize("zero_point", [-1, 256, 1.5])
def test_fixed_spec_with_a_bad_zero_point_is_rejected_on_construction(zero_point):
    with pytest.raises(ValueError) as info:
        qw.FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=0.1, zero_point=zero_point)
    assert_names(info, "FixedQParamsQuantizationSpec", "zero_point")


def test_calibration_skipped_raises_naming_every_observer():
    caller = Caller()

    def annotate(gm):
        conv, linear = _node(gm, aten.conv2d.default), _node(gm, aten.linear.default)
        annotate_input_qspec_map(conv, conv.args[0], ACT)
        annotate_output_qspec(linear, ACT)

    prepared = qw.prepare_pt2e(caller.gm, FnQuantizer(annotate))
    with pytest.raises(qw.ObserverNotCalibratedError) as info:
        qw.convert_pt2e(prepared)
    assert_names(info, "2 observer(s)", "'x'", "'linear'")
    caller.assert_untouched()


# -- quantizers that raise in each hook -------------------------------------------------------

HOOKS = ["transform_for_annotation", "annotate", "validate", "prepare_obs_or_fq_callback"]


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("error", [ValueError("backend cannot run this"), KeyError("config"), qw.AnnotationError("x")])
def test_an_exception_from_a_hook_keeps_its_class_and_names_the_quantizer_and_hook(hook, error):
    caller = Caller()
    with pytest.raises(type(error)) as info:
        qw.prepare_pt2e(caller.gm, FnQuantizer(raises={hook: error}))
    assert info.value is error
    assert f"raised in {hook}() of quantizer 'corpus', called by quantweave.prepare_pt2e" in info.value.__notes__
    caller.assert_untouched()


@pytest.mark.parametrize("hook", HOOKS)
def test_an_exception_from_a_composed_member_names_the_member(hook):
    caller = Caller()
    failing = FnQuantizer(raises={hook: RuntimeError("member failed")})
    failing.name = "failing"
    composed = qw.ComposableQuantizer([FnQuantizer(), failing])
    with pytest.raises(RuntimeError, match="member failed") as info:
        qw.prepare_qat_pt2e(caller.gm, composed)
    notes = info.value.__notes__
    assert "raised by member 'failing' of ComposableQuantizer 'corpus+failing'" in notes
    assert f"raised in {hook}() of quantizer 'corpus+failing', called by quantweave.prepare_qat_pt2e" in notes
    caller.assert_untouched()


def test_transform_returning_something_else_raises_type_error_naming_the_quantizer():
    class Bad(FnQuantizer):
        def transform_for_annotation(self, model):
            return None

    caller = Caller()
    with pytest.raises(TypeError) as info:
        qw.prepare_pt2e(caller.gm, Bad())
    assert_names(info, "Bad.transform_for_annotation", "GraphModule", "NoneType")
    caller.assert_untouched()


def test_broken_declarations_do_not_hide_what_was_quantized():
    """quantization_capabilities() raising: the report still lists what was quantized; a
    composition's capability table lets the member's exception through unchanged."""
    caller = Caller()

    def annotate(gm):
        conv = _node(gm, aten.conv2d.default)
        annotate_input_qspec_map(conv, conv.args[0], ACT)
        mark_annotated(conv, by="corpus")

    broken = FnQuantizer(annotate, raises={"quantization_capabilities": RuntimeError("declarations broken")})
    prepared = qw.prepare_pt2e(caller.gm, broken)
    rows = {r.node: r for r in qw.annotation_report(prepared, broken).nodes}
    assert (rows["conv2d"].status, rows["conv2d"].quantizer) == ("quantized", "corpus")
    with pytest.raises(RuntimeError, match="declarations broken"):
        qw.ComposableQuantizer([broken]).capability_table()
    caller.assert_untouched()


@pytest.mark.parametrize("quantizer", ["x86", None, torch.nn.Linear(2, 2)], ids=["str", "None", "module"])
def test_something_that_is_not_a_quantizer_raises_type_error_naming_its_type(quantizer):
    caller = Caller()
    with pytest.raises(TypeError) as info:
        qw.prepare_pt2e(caller.gm, quantizer)
    assert_names(info, "prepare_pt2e", "quantweave.Quantizer", type(quantizer).__name__)
    caller.assert_untouched()


def test_untraceable_model_fails_in_torch_export_before_quantweave_runs():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.export cannot trace it
                return x + 1
            return x - 1

    with pytest.raises(RuntimeError, match="data-dependent") as info:  # torch's error, from torch.export
        torch.export.export(DataDependent(), (torch.randn(2),))
    assert not type(info.value).__module__.startswith("quantweave")


# -- awkward models: a correct result, nothing of the caller's lost ---------------------------


def test_messages_quote_node_names_that_exist():
    """The names the corpus errors quote are nodes of the caller's graph (guards the regexes
    above against naming a node that the export no longer produces)."""
    names = {n.name for n in Caller().gm.graph.nodes}
    for *_, message in PREPARE_ERRORS:
        for quoted in re.findall(r"'(\w+)'", message):
            assert quoted in names | {"x"}, quoted

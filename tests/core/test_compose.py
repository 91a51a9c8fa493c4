"""ComposableQuantizer: order, conflicts, forwarding, merged capabilities."""

import pytest
import torch

import quantweave as qw
from quantweave.capabilities import Capability, Mode, TensorQuant
from quantweave.compose import AnnotationConflictError, ComposableQuantizer
from quantweave.observers import MinMaxObserver
from quantweave.plugin_api import ANNOTATED_BY_KEY, is_annotated, mark_annotated
from tests.helpers import assert_names, export

aten = torch.ops.aten
KEY = "quantization_annotation"
ACT = TensorQuant("uint8", 0, 255)


def spec(dtype=torch.uint8):
    return qw.QuantizationSpec(dtype=dtype, observer_or_fake_quant_ctr=MinMaxObserver, qscheme=torch.per_tensor_affine)


class OpQuantizer(qw.Quantizer):
    """Annotates the output of every node calling ``target``, skipping claimed nodes."""

    def __init__(self, name, target, dtype=torch.uint8, caps=(), log=None):
        self.name, self.target, self.dtype, self.caps, self.log = name, target, dtype, caps, log

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.target == self.target and not is_annotated(node):
                node.meta[KEY] = qw.QuantizationAnnotation(output_qspec=spec(self.dtype), _annotated=True)
        return model

    def validate(self, model):
        if self.log is not None:
            self.log.append(("validate", self.name))

    def prepare_obs_or_fq_callback(self, model, observers):
        if self.log is not None:
            self.log.append(("callback", self.name, len(observers)))

    def quantization_capabilities(self):
        return self.caps


class Rogue(qw.Quantizer):
    """Misbehaves on relu nodes that someone else annotated."""

    def __init__(self, how):
        self.name, self.how = "rogue", how

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.target == aten.relu.default and KEY in node.meta:
                if self.how == "replace":
                    node.meta[KEY] = qw.QuantizationAnnotation(output_qspec=spec(torch.int8))
                elif self.how == "remove":
                    del node.meta[KEY]
                else:
                    node.meta[KEY].output_qspec = spec(torch.int8)
        return model


class M(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


def gm():
    return export(M(), torch.randn(4))


def annotated_by(model):
    return {n.name: n.meta[ANNOTATED_BY_KEY] for n in model.graph.nodes if ANNOTATED_BY_KEY in n.meta}


def test_first_annotator_wins_and_owners_are_recorded():
    a = OpQuantizer("a", aten.relu.default, torch.uint8)
    b = OpQuantizer("b", aten.relu.default, torch.int8)
    model = gm()
    ComposableQuantizer([a, b]).annotate(model)
    relu = next(n for n in model.graph.nodes if n.target == aten.relu.default)
    assert relu.meta[KEY].output_qspec.dtype == torch.uint8
    composed = ComposableQuantizer([b, a])
    model = gm()
    composed.annotate(model)
    relu = next(n for n in model.graph.nodes if n.target == aten.relu.default)
    assert relu.meta[KEY].output_qspec.dtype == torch.int8
    assert annotated_by(model) == {"relu": "b"}


@pytest.mark.parametrize(
    ("how", "what"),
    [("replace", "replaced"), ("remove", "removed"), ("mutate", r"mutated in place.*output_qspec")],
)
def test_later_member_changing_an_earlier_annotation_is_an_error(how, what):
    composed = ComposableQuantizer([OpQuantizer("a", aten.relu.default), Rogue(how)])
    # the later member, what it did, the earlier member, the node, the fix; in that order (who changed whose)
    with pytest.raises(AnnotationConflictError, match=rf"'rogue' {what}\b.*'a'.*node 'relu'.*is_annotated"):
        composed.annotate(gm())


def test_conflict_detected_through_prepare_and_callers_model_untouched():
    model = gm()
    before = str(model.graph)
    with pytest.raises(AnnotationConflictError):
        qw.prepare_pt2e(model, ComposableQuantizer([OpQuantizer("a", aten.relu.default), Rogue("mutate")]))
    assert str(model.graph) == before and all(KEY not in n.meta for n in model.graph.nodes)


def test_validate_and_callback_are_forwarded_to_every_member_in_order():
    log = []
    a = OpQuantizer("a", aten.relu.default, log=log)
    b = OpQuantizer("b", aten.add.Tensor, log=log)
    prepared = qw.prepare_pt2e(gm(), ComposableQuantizer([a, b]))
    assert log == [("validate", "a"), ("validate", "b"), ("callback", "a", 2), ("callback", "b", 2)]
    assert len([n for n in prepared.graph.nodes if n.op == "call_module" and "activation" in n.target]) == 2


def test_a_failing_member_validate_propagates():
    class Strict(OpQuantizer):
        def validate(self, model):
            raise ValueError("strict: relu must not be quantized")

    with pytest.raises(ValueError) as info:
        qw.prepare_pt2e(gm(), ComposableQuantizer([OpQuantizer("a", aten.relu.default), Strict("s", aten.add.Tensor)]))
    assert_names(info, "strict", "relu", "must not be quantized")


def test_merged_capabilities_show_who_serves_and_who_is_shadowed():
    first = OpQuantizer(
        "first", aten.relu.default, caps=(Capability("conv2d", "static", ACT), Capability("add", "static", ACT))
    )
    second = OpQuantizer(
        "second", aten.add.Tensor, caps=(Capability("conv2d", "static", ACT), Capability("mul", "static", ACT))
    )
    composed = ComposableQuantizer([first, second])
    rows = {(r.pattern, r.mode): r for r in composed.capability_table()}
    assert rows[("conv2d", Mode.STATIC)].served_by == "first"
    assert rows[("conv2d", Mode.STATIC)].shadowed == ("second",)
    assert rows[("mul", Mode.STATIC)].served_by == "second" and rows[("mul", Mode.STATIC)].shadowed == ()
    caps = composed.quantization_capabilities()
    assert [(c.pattern, c.quantizer) for c in caps] == [("add", "first"), ("conv2d", "first"), ("mul", "second")]


def test_bad_members_are_rejected():
    with pytest.raises(ValueError) as info:
        ComposableQuantizer([])
    assert_names(info, "needs at least one quantizer")
    with pytest.raises(TypeError) as info:
        ComposableQuantizer([OpQuantizer("a", aten.relu.default), "x86"])
    assert_names(info, "member 1", "quantweave.Quantizer", "str")


def test_duplicate_labels_are_disambiguated():
    composed = ComposableQuantizer([OpQuantizer("q", aten.relu.default), OpQuantizer("q", aten.add.Tensor)])
    assert composed.labels == ["q#0", "q#1"]
    model = gm()
    composed.annotate(model)
    assert annotated_by(model) == {"relu": "q#0", "add": "q#1"}


def test_annotating_a_second_model_leaves_the_first_ones_owners_alone():
    # regression: owners used to live on the ComposableQuantizer, so the second call rewrote the first's
    composed = ComposableQuantizer([OpQuantizer("r", aten.relu.default), OpQuantizer("a", aten.add.Tensor)])
    first, second = gm(), gm()
    composed.annotate(first)
    relu = next(n for n in second.graph.nodes if n.target == aten.relu.default)
    mark_annotated(relu, by="caller")  # pre-annotated in the second model: r must skip it
    composed.annotate(second)
    assert annotated_by(first) == {"relu": "r", "add": "a"}
    assert annotated_by(second) == {"relu": "caller", "add": "a"}


def test_the_rows_own_pattern_claims_after_its_producer_before_a_later_pattern_of_the_same_ops():
    """The relu row is probed behind a cat. The member declares relu (only after its own
    producer), cat, and a later pattern of the same op claiming after any producer. The cat
    claims mid-pass; before, the later pattern took the relu in that same pass and the row
    read as not served as declared. Now the member's loop restarts after each claim, so its
    own pattern gets the relu first."""
    caps = (
        Capability("relu", "static", ACT, input_from="own"),
        Capability("cat", "static", ACT),
        Capability("relu_after_any", "static", ACT, ops=("aten.relu.default",), input_from="any"),
    )
    composed = ComposableQuantizer([OpQuantizer("member", aten.relu.default, caps=caps)])
    row = {(r.pattern, r.mode): r for r in composed.capability_table()}[("relu", Mode.STATIC)]
    assert row.served_as == (("member", "relu"),)
    assert row.served_by == "member" and row.served_as_declared and row.shadowed == ()
    assert "relu" in {c.pattern for c in composed.quantization_capabilities()}

"""prepare_pt2e: non-mutation contract, BN folding, sharing groups and their errors."""

import dataclasses

import pytest
import torch

import quantweave as qw
from quantweave.authoring import annotate_output_qspec
from quantweave.observers import FakeQuantize, MinMaxObserver, ObserverBase
from quantweave.testing.models import resnet18_like
from quantweave.testing.reference import make_reference_quantizer
from tests.helpers import assert_names, count_code_generations, export

aten = torch.ops.aten
KEY = "quantization_annotation"


def act(dtype=torch.uint8):
    return qw.QuantizationSpec(dtype=dtype, observer_or_fake_quant_ctr=MinMaxObserver, qscheme=torch.per_tensor_affine)


class FnQuantizer(qw.Quantizer):
    """Annotates with a plain function, for tests of the engine itself."""

    def __init__(self, fn):
        self.fn = fn

    def annotate(self, model):
        self.fn(model)
        return model


def nodes(gm, target):
    return [n for n in gm.graph.nodes if n.target == target]


class TwoReluCat(torch.nn.Module):
    def forward(self, x, y):
        return torch.cat([torch.relu(x), torch.relu(y)], 1)


def observer_modules(prepared):
    return {id(m) for m in prepared.modules() if isinstance(m, ObserverBase)}


def test_prepare_does_not_mutate_the_callers_model():
    model = resnet18_like(width=8, num_classes=10)
    gm = export(model, torch.randn(1, 3, 32, 32))
    graph_before = str(gm.graph)
    state_before = {k: v.clone() for k, v in gm.state_dict().items()}
    assert state_before, "the model has parameters and buffers to watch"
    meta_before = [dict(n.meta) for n in gm.graph.nodes]
    modules_before = dict(gm.named_modules())
    prepared = qw.prepare_pt2e(gm, make_reference_quantizer())
    prepared(torch.randn(1, 3, 32, 32))
    qw.convert_pt2e(prepared)
    assert str(gm.graph) == graph_before
    assert all(KEY not in n.meta for n in gm.graph.nodes)
    assert [dict(n.meta) for n in gm.graph.nodes] == meta_before
    assert dict(gm.named_modules()).keys() == modules_before.keys()
    after = gm.state_dict()
    assert after.keys() == state_before.keys()
    assert all(torch.equal(after[k], v) for k, v in state_before.items())


def test_prepare_shares_weights_instead_of_copying_them():
    class Lin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

    gm = export(Lin(), torch.randn(2, 4))
    prepared = qw.prepare_pt2e(gm, make_reference_quantizer())
    assert prepared.get_submodule("fc").weight is gm.get_submodule("fc").weight


def test_eval_batch_norm_is_folded_into_conv_and_outputs_are_unchanged():
    model = resnet18_like(width=8, num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    gm = export(model, x)
    prepared = qw.prepare_pt2e(gm, FnQuantizer(lambda m: None))
    assert not nodes(prepared, aten.batch_norm.default)
    assert nodes(gm, aten.batch_norm.default), "the caller's graph keeps its BNs"
    torch.testing.assert_close(prepared(x), model(x), rtol=1e-4, atol=1e-4)


def test_annotations_made_before_prepare_are_honoured_and_left_on_the_callers_graph():
    gm = export(TwoReluCat(), torch.randn(2, 3), torch.randn(2, 3))
    relu = nodes(gm, aten.relu.default)[0]
    annotate_output_qspec(relu, act())
    prepared = qw.prepare_pt2e(gm, FnQuantizer(lambda m: None))
    assert len(observer_modules(prepared)) == 1
    assert relu.meta[KEY].output_qspec == act()  # caller's annotation object untouched


def annotate_cat(first_shared_later: bool):
    """cat(relu, relu_1): the spec anchor sits on the second input when asked."""

    def fn(gm):
        cat = nodes(gm, aten.cat.default)[0]
        a, b = cat.args[0]
        anchor, follower = (b, a) if first_shared_later else (a, b)
        shared = qw.SharedQuantizationSpec((anchor, cat))
        cat.meta[KEY] = qw.QuantizationAnnotation(
            input_qspec_map={follower: shared, anchor: act()}, output_qspec=shared
        )
        for relu in (a, b):
            relu.meta[KEY] = qw.QuantizationAnnotation(output_qspec=act())

    return fn


@pytest.mark.parametrize("anchor_later", [False, True])
def test_shared_groups_do_not_depend_on_graph_order(anchor_later):
    # torchao asserts when the anchor of a SharedQuantizationSpec comes later (ao#4421)
    gm = export(TwoReluCat(), torch.randn(2, 3), torch.randn(2, 3))
    prepared = qw.prepare_pt2e(gm, FnQuantizer(annotate_cat(anchor_later)))
    assert len(observer_modules(prepared)) == 1


def test_shared_spec_chains_resolve_transitively():
    class Chain(torch.nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(torch.relu(x)))

    def fn(gm):
        r0, r1, r2 = nodes(gm, aten.relu.default)
        r0.meta[KEY] = qw.QuantizationAnnotation(output_qspec=qw.SharedQuantizationSpec(r1))
        r1.meta[KEY] = qw.QuantizationAnnotation(output_qspec=qw.SharedQuantizationSpec(r2))
        r2.meta[KEY] = qw.QuantizationAnnotation(output_qspec=act())

    prepared = qw.prepare_pt2e(export(Chain(), torch.randn(3)), FnQuantizer(fn))
    assert len(observer_modules(prepared)) == 1
    assert len([n for n in prepared.graph.nodes if n.op == "call_module" and "activation" in n.target]) == 3


def test_implicit_sharing_merges_equal_specs_and_can_be_disabled():
    class M(torch.nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            return y + 1, y * 2

    def fn(allow):
        def annotate(gm):
            relu = nodes(gm, aten.relu.default)[0]
            relu.meta[KEY] = qw.QuantizationAnnotation(output_qspec=act())
            for user in list(relu.users):
                user.meta[KEY] = qw.QuantizationAnnotation(input_qspec_map={relu: act()}, allow_implicit_sharing=allow)

        return annotate

    shared = qw.prepare_pt2e(export(M(), torch.randn(3)), FnQuantizer(fn(True)))
    separate = qw.prepare_pt2e(export(M(), torch.randn(3)), FnQuantizer(fn(False)))
    assert len(observer_modules(shared)) == 1
    assert len(observer_modules(separate)) == 3


def test_edge_with_a_different_spec_gets_its_own_observer():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    def fn(gm):
        relu = nodes(gm, aten.relu.default)[0]
        add = nodes(gm, aten.add.Tensor)[0]
        relu.meta[KEY] = qw.QuantizationAnnotation(output_qspec=act(torch.uint8))
        add.meta[KEY] = qw.QuantizationAnnotation(input_qspec_map={relu: act(torch.int8)})

    prepared = qw.prepare_pt2e(export(M(), torch.randn(3)), FnQuantizer(fn))
    add = nodes(prepared, aten.add.Tensor)[0]
    edge_observer = prepared.get_submodule(add.args[0].target)
    assert edge_observer.dtype == torch.int8
    assert prepared.get_submodule(add.args[0].args[0].target).dtype == torch.uint8


# ---- errors ---------------------------------------------------------------------------


def test_dangling_shared_spec_names_both_ends():
    def fn(gm):
        cat = nodes(gm, aten.cat.default)[0]
        a, b = cat.args[0]
        cat.meta[KEY] = qw.QuantizationAnnotation(input_qspec_map={b: qw.SharedQuantizationSpec((a, cat))})

    gm = export(TwoReluCat(), torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(qw.SharingError) as info:
        qw.prepare_pt2e(gm, FnQuantizer(fn))
    assert_names(info, "'relu_1'", "'cat'", "SharedQuantizationSpec", "'relu'", "no quantization spec")


def test_cyclic_shared_specs_are_reported_with_their_members():
    def fn(gm):
        r0, r1 = nodes(gm, aten.relu.default)
        r0.meta[KEY] = qw.QuantizationAnnotation(output_qspec=qw.SharedQuantizationSpec(r1))
        r1.meta[KEY] = qw.QuantizationAnnotation(output_qspec=qw.SharedQuantizationSpec(r0))

    gm = export(TwoReluCat(), torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(qw.SharingError) as info:
        qw.prepare_pt2e(gm, FnQuantizer(fn))
    assert_names(info, "cyclic", "SharedQuantizationSpec", "'relu'", "'relu_1'")


def test_cyclic_derived_specs_are_reported():
    def derived(target):
        return qw.DerivedQuantizationSpec(derived_from=[target], derive_qparams_fn=lambda o: o, dtype=torch.int32)

    def fn(gm):
        r0, r1 = nodes(gm, aten.relu.default)
        r0.meta[KEY] = qw.QuantizationAnnotation(output_qspec=derived(r1))
        r1.meta[KEY] = qw.QuantizationAnnotation(output_qspec=derived(r0))

    gm = export(TwoReluCat(), torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(qw.SharingError) as info:
        qw.prepare_pt2e(gm, FnQuantizer(fn))
    assert_names(info, "cyclic", "DerivedQuantizationSpec", "'relu'", "'relu_1'")


def test_input_map_naming_a_non_input_is_rejected():
    def fn(gm):
        r0, r1 = nodes(gm, aten.relu.default)
        r1.meta[KEY] = qw.QuantizationAnnotation(input_qspec_map={r0: act()})

    gm = export(TwoReluCat(), torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(qw.AnnotationError) as info:
        qw.prepare_pt2e(gm, FnQuantizer(fn))
    assert_names(info, "'relu_1'", "input_qspec_map", "'relu'", "['y']")


def test_wrong_annotation_and_spec_types_are_rejected():
    def bad_annotation(gm):
        nodes(gm, aten.relu.default)[0].meta[KEY] = {"output_qspec": act()}

    def bad_spec(gm):
        nodes(gm, aten.relu.default)[0].meta[KEY] = qw.QuantizationAnnotation(output_qspec="uint8")

    gm = export(TwoReluCat(), torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(qw.AnnotationError) as info:
        qw.prepare_pt2e(gm, FnQuantizer(bad_annotation))
    assert_names(info, "'relu'", "QuantizationAnnotation", "dict")
    with pytest.raises(qw.AnnotationError) as info:
        qw.prepare_pt2e(gm, FnQuantizer(bad_spec))
    assert_names(info, "'relu'", "QuantizationSpecBase", "str")


def test_observer_that_cannot_be_built_names_the_edge():
    def broken_ctr(**kwargs):
        raise RuntimeError("boom")

    def fn(gm):
        spec = qw.QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=broken_ctr)
        nodes(gm, aten.relu.default)[0].meta[KEY] = qw.QuantizationAnnotation(output_qspec=spec)

    gm = export(TwoReluCat(), torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(qw.AnnotationError) as info:
        qw.prepare_pt2e(gm, FnQuantizer(fn))
    assert_names(info, "'relu'", "observer", "boom")


def test_errors_leave_the_callers_model_untouched():
    gm = export(TwoReluCat(), torch.randn(2, 3), torch.randn(2, 3))
    before = str(gm.graph)

    def fn(gm):
        r0, r1 = nodes(gm, aten.relu.default)
        r0.meta[KEY] = qw.QuantizationAnnotation(output_qspec=qw.SharedQuantizationSpec(r1))
        r1.meta[KEY] = qw.QuantizationAnnotation(output_qspec=qw.SharedQuantizationSpec(r0))

    with pytest.raises(qw.SharingError):
        qw.prepare_pt2e(gm, FnQuantizer(fn))
    assert str(gm.graph) == before and all(KEY not in n.meta for n in gm.graph.nodes)


def test_prepare_rejects_a_plain_module():
    with pytest.raises(TypeError) as info:
        qw.prepare_pt2e(TwoReluCat(), FnQuantizer(lambda m: None))
    assert_names(info, "prepare_pt2e", "GraphModule", "TwoReluCat")


@dataclasses.dataclass
class TaggedAnnotation(qw.QuantizationAnnotation):
    """A backend's annotation subclass with a field of its own (like quantweave_x86's)."""

    tag: str = ""


@dataclasses.dataclass(eq=True, frozen=True)
class TaggedShared(qw.SharedQuantizationSpec):
    tag: str = ""


@dataclasses.dataclass(eq=True, frozen=True)
class TaggedDerived(qw.DerivedQuantizationSpec):
    tag: str = ""


def test_annotations_remapped_onto_the_copy_keep_their_subclasses_and_fields():
    gm = export(TwoReluCat(), torch.randn(2, 3), torch.randn(2, 3))
    cat = nodes(gm, aten.cat.default)[0]
    first, second = cat.args[0]
    shared = TaggedShared((first, cat), tag="spec field")
    cat.meta[KEY] = TaggedAnnotation(input_qspec_map={first: act(), second: shared}, tag="annotation field")
    prepared = qw.prepare_pt2e(gm, FnQuantizer(lambda m: None))
    (new_cat,) = nodes(prepared, aten.cat.default)
    annotation = new_cat.meta[KEY]
    assert type(annotation) is TaggedAnnotation and annotation.tag == "annotation field"
    new_first, new_second = (n for n in prepared.graph.nodes if n.name in (first.name, second.name))
    assert set(annotation.input_qspec_map) == {new_first, new_second}, "keys name the copy's nodes"
    spec = annotation.input_qspec_map[new_second]
    assert type(spec) is TaggedShared and spec.tag == "spec field"
    assert spec.edge_or_node == (new_first, new_cat), "the shared edge names the copy's nodes"
    assert cat.meta[KEY].input_qspec_map[second] is shared, "the caller's annotation is left as it was"


def test_qat_edge_rewrite_keeps_annotation_and_spec_subclasses():
    class ConvBn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.bn = torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv(x))

    fake_act = qw.QuantizationSpec(
        dtype=torch.uint8, observer_or_fake_quant_ctr=FakeQuantize, qscheme=torch.per_tensor_affine
    )
    fake_weight = qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=-127,
        quant_max=127,
        observer_or_fake_quant_ctr=FakeQuantize,
        qscheme=torch.per_tensor_symmetric,
    )

    def annotate(gm):
        conv = nodes(gm, aten.conv2d.default)[0]
        x, weight, bias = conv.args[:3]
        derived = TaggedDerived(
            derived_from=[(x, conv), (weight, conv)],
            derive_qparams_fn=lambda observers: (torch.tensor(1.0), torch.tensor(0)),
            dtype=torch.int32,
            tag="bias spec",
        )
        conv.meta[KEY] = TaggedAnnotation(input_qspec_map={x: fake_act, weight: fake_weight, bias: derived}, tag="conv")

    exported = export(ConvBn().train(), torch.randn(2, 3, 8, 8))
    prepared = qw.prepare_qat_pt2e(exported, FnQuantizer(annotate))
    (conv,) = nodes(prepared, aten.conv2d.default)
    scaled_weight = conv.args[1].args[0]  # conv <- weight fake-quantizer <- weight * bn scale
    assert scaled_weight.target is aten.mul.Tensor, prepared.graph
    annotation = conv.meta[KEY]
    assert type(annotation) is TaggedAnnotation and annotation.tag == "conv"
    assert scaled_weight in annotation.input_qspec_map, "the weight edge names the rewritten weight"
    (derived,) = (s for s in annotation.input_qspec_map.values() if isinstance(s, qw.DerivedQuantizationSpec))
    assert type(derived) is TaggedDerived and derived.tag == "bias spec"
    assert derived.derived_from[1] == (scaled_weight, conv)


def test_code_is_generated_when_first_needed_not_by_prepare_or_convert(monkeypatch):
    import inspect

    model = TwoReluCat().eval()
    x, y = torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8)
    gm = export(model, x, y)
    calls = count_code_generations(monkeypatch)
    prepared = qw.prepare_pt2e(gm, make_reference_quantizer())
    assert calls == []  # a prepared model converted without running never pays for its code
    assert inspect.signature(prepared.forward) == inspect.signature(gm.forward)  # known without it
    prepared(x, y)
    assert len(calls) == 1
    converted = qw.convert_pt2e(prepared)
    assert len(calls) == 1
    torch.testing.assert_close(converted(x, y), converted(x, y))
    assert len(calls) == 2 and "def forward" in converted.code

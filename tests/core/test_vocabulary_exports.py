"""Probes are exported once per process and handed out as copies: the conformance kit pays
one ``torch.export`` per (pattern, mode, shapes) however many quantizers it checks, and
whatever one quantizer does to its copy never reaches the next."""

import pytest
import torch

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, annotate_output_qspec
from quantweave.capabilities import Capability, TensorQuant
from quantweave.plugin_api import mark_annotated
from quantweave.registry import QuantizerInfo
from quantweave.testing.conformance import check_capability
from quantweave.vocabulary import core_vocabulary, forget_exported_probes
from tests.helpers import WEIGHTED_ACT, WEIGHTED_WEIGHT

aten = torch.ops.aten
ACT = TensorQuant("uint8", 0, 255)
W = TensorQuant("int8", -128, 127, "per_channel", symmetric=True)
CAP = Capability("linear", "static", ACT, W)


class LinearQuantizer(qw.Quantizer):
    """Annotates every linear; records what it was handed (weights, meta keys, node names)."""

    def __init__(self, vandal=False):
        self.vandal = vandal
        self.seen = []

    def transform_for_annotation(self, model):
        weights = {
            n.target: model.get_submodule("").get_parameter(n.target).detach().clone()
            for n in model.graph.nodes
            if n.op == "get_attr" and "weight" in str(n.target)
        }
        self.seen.append((weights, [sorted(n.meta) for n in model.graph.nodes], [n.name for n in model.graph.nodes]))
        if self.vandal:  # everything a careless quantizer could do to the graph it is given
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(7.0)
            for node in model.graph.nodes:
                node.meta["vandal"] = True
            first = next(n for n in model.graph.nodes if n.op == "call_function")
            with model.graph.inserting_after(first):
                extra = model.graph.call_function(aten.clone.default, (first,))
            first.replace_all_uses_with(extra, delete_user_cb=lambda user: user is not extra)
            model.recompile()
        return model

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.target == aten.linear.default:
                annotate_input_qspec_map(node, node.args[0], WEIGHTED_ACT)
                annotate_input_qspec_map(node, node.args[1], WEIGHTED_WEIGHT)
                annotate_output_qspec(node, WEIGHTED_ACT)
                mark_annotated(node)
        return model

    def quantization_capabilities(self):
        return (CAP,)


@pytest.fixture
def export_calls(monkeypatch):
    """Counts torch.export.export calls, starting from no exported probe."""
    forget_exported_probes()
    calls = []
    real = torch.export.export

    def counting(model, *args, **kwargs):
        calls.append(type(model).__name__)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counting)
    yield calls
    forget_exported_probes()


def test_two_quantizers_checked_on_one_pattern_export_its_probe_once(export_calls):
    first, second = LinearQuantizer(), LinearQuantizer()
    assert check_capability(QuantizerInfo("a", lambda: first, (CAP,)), CAP) == []
    assert check_capability(QuantizerInfo("b", lambda: second, (CAP,)), CAP) == []
    assert len(export_calls) == 1, export_calls
    # each was handed the probe (and the same one)
    assert first.seen and second.seen
    assert first.seen[0][2] == second.seen[0][2]


def test_an_other_mode_is_an_other_export(export_calls):
    vocabulary = core_vocabulary()
    vocabulary.exported("conv2d_bn", train=False)
    vocabulary.exported("conv2d_bn", train=True)
    vocabulary.exported("conv2d_bn", train=True)
    assert len(export_calls) == 2


def test_what_a_quantizer_does_to_its_copy_never_reaches_the_next(export_calls):
    vandal, after = LinearQuantizer(vandal=True), LinearQuantizer()
    check_capability(QuantizerInfo("vandal", lambda: vandal, (CAP,)), CAP)  # it may fail: not the point
    assert check_capability(QuantizerInfo("after", lambda: after, (CAP,)), CAP) == []
    assert len(export_calls) == 1
    weights_before, meta_before, names_before = vandal.seen[0]
    weights_after, meta_after, names_after = after.seen[0]
    assert names_after == names_before  # no clone node
    assert meta_after == meta_before and not any("vandal" in keys for keys in meta_after)
    assert weights_after.keys() == weights_before.keys()
    assert all(torch.equal(weights_after[k], weights_before[k]) for k in weights_before)
    assert not any(bool((w == 7.0).all()) for w in weights_after.values())


def test_inputs_handed_out_are_copies(export_calls):
    vocabulary = core_vocabulary()
    gm, inputs = vocabulary.exported("linear")
    inputs[0].fill_(3.0)
    _, again = vocabulary.exported("linear")
    assert not torch.equal(again[0], inputs[0])
    assert gm is not vocabulary.exported("linear").graph_module
    assert len(export_calls) == 1


def test_a_pattern_without_a_probe_is_named():
    from quantweave.vocabulary import PatternSpec, Vocabulary

    vocabulary = Vocabulary([PatternSpec("conv3d", "3-D convolution", ("aten.conv3d.default",))])
    with pytest.raises(ValueError, match="conv3d"):
        vocabulary.exported("conv3d")

"""The vocabulary is one object: the core registers its patterns through the plugins' hook,
compositions read producers from it, the report lists its ops, and the old paths still work."""

import warnings

import pytest

import quantweave as qw
import quantweave.capabilities
from quantweave.capabilities import Capability, TensorQuant
from quantweave.plugin_api import hookimpl
from quantweave.registry import PluginManager
from quantweave.report import COMPUTE_OPS, reported_ops
from quantweave.vocabulary import PATTERNS, PRODUCERS, PatternSpec, Vocabulary, core_vocabulary

ACT = TensorQuant("uint8", 0, 255)
W = TensorQuant("int8", -128, 127, "per_channel", symmetric=True)
POOL_OPS = ("aten.max_pool2d.default",)


def test_the_registry_s_vocabulary_is_the_core_s_through_the_hook_plus_contributed():
    class Plugin:
        QUANTWEAVE_PLUGIN_API = 2

        @hookimpl
        def quantweave_quantizers(self):
            return []

        @hookimpl
        def quantweave_patterns(self):
            return [PatternSpec("my_pool", "a pool behind a conv", POOL_OPS, producer="conv2d")]

    manager = PluginManager(entry_points=[])
    manager.register("mine", Plugin())
    vocabulary = manager.vocabulary()
    assert isinstance(vocabulary, Vocabulary)
    assert set(vocabulary) == set(PATTERNS) | {"my_pool"}
    assert {vocabulary[name].origin for name in PATTERNS} == {"core"}
    assert vocabulary["my_pool"].origin == "mine"
    assert vocabulary.producer_ops("my_pool") == ("aten.conv2d.default",)
    # every core pattern has its probe and its producer
    assert all(vocabulary[name].probe is not None for name in PATTERNS)
    assert {name: vocabulary[name].producer for name in PRODUCERS} == PRODUCERS
    assert manager.plugins()[0].name == "mine"  # the core's registration is not listed as a plugin


class Member(qw.Quantizer):
    def __init__(self, name, caps):
        self.name, self.caps = name, caps

    def annotate(self, model):
        return model

    def quantization_capabilities(self):
        return self.caps


def test_a_composition_reads_a_pattern_s_producer_from_the_vocabulary_it_is_given():
    conv = Member("conv", [Capability("conv2d", "static", ACT, W)])
    pool = Member("pool", [Capability("my_pool", "static", ACT, ops=POOL_OPS, input_from="any")])
    composed = qw.ComposableQuantizer([conv, pool])
    contributed = PatternSpec("my_pool", "a pool behind a conv", POOL_OPS, producer="conv2d")
    row = {r.pattern: r for r in composed.capability_table(core_vocabulary().with_patterns({"my_pool": contributed}))}
    assert row["my_pool"].served_by == "pool"  # claimed after the conv its producer names
    # the core vocabulary knows no producer for it: input_from="any" never finds one
    assert {r.pattern: r for r in composed.capability_table()}["my_pool"].served_by == ""


def test_the_report_lists_the_ops_of_the_vocabulary_it_is_given():
    extra = Vocabulary([PatternSpec("my_op", "an op", ("aten.layer_norm.default",))])
    assert "aten.layer_norm.default" not in reported_ops()
    assert "aten.layer_norm.default" in reported_ops(vocabulary=core_vocabulary().with_patterns(extra))
    # and every compute op (conv3d, bmm...), whether a pattern names it or not (issue #24)
    assert reported_ops() == core_vocabulary().all_ops() | COMPUTE_OPS
    assert {"aten.conv3d.default", "aten.bmm.default"} <= reported_ops()


def test_documented_names_that_moved_warn_and_still_work():
    with pytest.warns(DeprecationWarning, match="quantweave.vocabulary.PATTERNS"):
        old = quantweave.capabilities.PATTERNS
    assert old is PATTERNS
    with pytest.warns(DeprecationWarning, match="core_patterns"):
        assert set(quantweave.capabilities.core_patterns()) == set(PATTERNS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # undocumented re-exports do not warn
        from quantweave.capabilities import PROBE_PRODUCERS
        from quantweave.capabilities import PatternSpec as OldSpec
        from quantweave.testing.conformance import PROBES
        from quantweave.testing.conformance import Vocabulary as OldVocabulary

    assert PROBE_PRODUCERS is PRODUCERS and OldSpec is PatternSpec and OldVocabulary is Vocabulary
    assert set(PROBES) == set(PATTERNS)


def test_a_vocabulary_holds_only_pattern_specs():
    with pytest.raises(TypeError, match="PatternSpec"):
        Vocabulary([("conv2d", "not a spec")])

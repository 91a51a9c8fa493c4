"""Issue #9: a composition's capability table comes from how the members' patterns overlap,
and it agrees with what the members really annotate on the probes."""

import pytest
import torch

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, annotate_output_qspec
from quantweave.plugin_api import Capability, Mode, Quant, TensorQuant, is_annotated, mark_annotated
from quantweave.testing import PluginManager
from quantweave.testing.conformance import check_composition
from quantweave_contrib_template import TemplateQuantizer

aten = torch.ops.aten
ACT = TensorQuant("uint8", 0, 255)


class AddQuantizer(qw.Quantizer):
    """Declares and annotates a standalone add (both inputs and the output)."""

    name = "adder"

    def annotate(self, model):
        spec = qw.QuantizationSpec(torch.uint8, qw.observers.HistogramObserver, 0, 255, torch.per_tensor_affine)
        for node in model.graph.nodes:
            if node.target == aten.add.Tensor and not is_annotated(node):
                for arg in node.args[:2]:
                    annotate_input_qspec_map(node, arg, spec)
                annotate_output_qspec(node, spec)
                mark_annotated(node)
        return model

    def quantization_capabilities(self):
        return (Capability("add", "static", ACT, output=Quant.quantized(ACT)),)


def x86():
    pytest.importorskip("quantweave_x86")
    from quantweave_x86 import X86InductorQuantizer

    return X86InductorQuantizer()


def rows(composed):
    return {r.pattern: r for r in composed.capability_table() if r.mode is Mode.STATIC}


def test_an_earlier_member_declaring_conv2d_shadows_a_later_conv2d_add():
    composed = qw.ComposableQuantizer([TemplateQuantizer(), x86()])
    row = rows(composed)["conv2d_add"]
    assert (row.served_by, row.shadowed) == ("template", ("x86",))
    assert row.served_as == (("template", "conv2d"), None)  # x86 cannot claim the add without its conv
    assert not row.served_as_declared
    assert "conv2d_add" not in {c.pattern for c in composed.quantization_capabilities()}
    conv = rows(composed)["conv2d"]
    assert (conv.served_by, conv.shadowed, conv.capability.quantizer) == ("template", ("x86",), "template")
    assert check_composition(composed) == []


def test_two_earlier_members_split_a_fused_pattern_between_them():
    composed = qw.ComposableQuantizer([TemplateQuantizer(), AddQuantizer(), x86()])
    row = rows(composed)["conv2d_add"]
    assert row.served_as == (("template", "conv2d"), ("adder", "add"))
    assert (row.served_by, row.shadowed) == ("template", ("x86",))
    assert check_composition(composed) == []


def test_in_the_other_order_the_fused_pattern_is_served_whole():
    composed = qw.ComposableQuantizer([x86(), TemplateQuantizer()])
    table = rows(composed)
    assert table["conv2d_add"].served_as == (("x86", "conv2d_add"), ("x86", "conv2d_add"))
    assert table["conv2d_add"].served_as_declared and table["conv2d_add"].shadowed == ()
    assert (table["linear_relu"].served_by, table["linear_relu"].shadowed) == ("x86", ("template",))
    assert check_composition(composed) == []


def test_a_table_that_lies_is_caught_on_the_probes():
    class Pretender(qw.Quantizer):
        """Declares conv2d but annotates nothing."""

        name = "pretender"

        def annotate(self, model):
            return model

        def quantization_capabilities(self):
            return (Capability("conv2d", "static", ACT),)

    failures = check_composition(qw.ComposableQuantizer([Pretender(), x86()]))
    messages = {f.pattern: f.message for f in failures}
    assert "conv2d" in messages and "claimed by ['pretender']; on the probe: conv2d: x86" in messages["conv2d"]


def test_composed_capabilities_carry_plugin_provenance():
    pm = PluginManager(entry_points=[])
    from quantweave_contrib_template import plugin

    pm.register("template", plugin)
    composed = qw.ComposableQuantizer([pm.get_quantizer("template"), AddQuantizer()])
    provenance = {(c.pattern, c.plugin, c.quantizer) for c in composed.quantization_capabilities()}
    assert ("conv2d", "template", "template") in provenance and ("add", "", "adder") in provenance


def test_a_member_serves_its_own_pattern_before_another_that_fits_the_same_ops():
    pytest.importorskip("quantweave_xnnpack")
    import quantweave_xnnpack as qx

    xnnpack = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config())
    row = rows(qw.ComposableQuantizer([xnnpack]))["conv2d_relu6"]
    assert row.served_as_declared and row.shadowed == ()
    assert "conv2d_relu6" in {c.pattern for c in qw.ComposableQuantizer([xnnpack]).quantization_capabilities()}

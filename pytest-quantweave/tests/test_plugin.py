"""pytest-quantweave as a plugin author uses it: one line runs the conformance kit, one
test per declared capability with readable ids; a quantizer that breaks its declaration
fails the item of that capability, naming the pattern and the field; a plugin that does
not load fails, saying why; a test that names no plugin is a usage error naming the
marker and the ini option; the plugin changes nothing for tests that do not use it."""

import pytest

TEMPLATE_CAPABILITIES = [
    "template-conv2d-static",
    "template-conv2d_relu-static",
    "template-linear-static",
    "template-linear_relu-static",
    "template-linear-dynamic",
]

BROKEN_PLUGIN = """
import torch
import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, annotate_output_qspec
from quantweave.observers import HistogramObserver, PerChannelMinMaxObserver
from quantweave.plugin_api import FLOAT, Capability, Mode, Quant, QuantizerInfo, TensorQuant, hookimpl, mark_annotated

QUANTWEAVE_PLUGIN_API = 2
ACT = TensorQuant("int8", -128, 127, "per_tensor", symmetric=False)
WEIGHT = TensorQuant("int8", -127, 127, "per_channel", symmetric=True, ch_axis=0)
CAPS = (
    Capability("linear", Mode.STATIC, ACT, WEIGHT, output=Quant.quantized(ACT), bias=FLOAT),
    # declared, but the quantizer never annotates the relu: the kit must say so
    Capability("linear_relu", Mode.STATIC, ACT, WEIGHT, output=Quant.quantized(ACT), bias=FLOAT, fused=True),
)


class Broken(qw.Quantizer):
    name = "broken"

    def annotate(self, model):
        act = qw.QuantizationSpec(torch.int8, HistogramObserver, quant_min=-128, quant_max=127,
                                  qscheme=torch.per_tensor_affine)
        weight = qw.QuantizationSpec(torch.int8, PerChannelMinMaxObserver, quant_min=-127, quant_max=127,
                                     qscheme=torch.per_channel_symmetric, ch_axis=0)
        for node in model.graph.nodes:
            if node.target == torch.ops.aten.linear.default:
                annotate_input_qspec_map(node, node.args[0], act)
                annotate_input_qspec_map(node, node.args[1], weight)
                annotate_output_qspec(node, act)
                mark_annotated(node)
        return model

    def quantization_capabilities(self):
        return CAPS


@hookimpl
def quantweave_quantizers():
    return [QuantizerInfo(name="broken", factory=Broken, capabilities=CAPS)]
"""


def test_one_line_collects_one_item_per_declared_capability(pytester, run):
    pytester.makepyfile(
        test_conformance="""
        from pytest_quantweave import conformance_suite

        TestConformance = conformance_suite("quantweave_contrib_template.plugin", name="template")
        """
    )
    result = run("--collect-only", "-q")
    result.assert_outcomes()
    ids = [line for line in result.outlines if "::" in line]
    capability_items = [i.split("[", 1)[1].rstrip("]") for i in ids if "test_each_declared_capability" in i]
    assert capability_items == TEMPLATE_CAPABILITIES
    assert "test_conformance.py::TestConformance::test_the_quantizer_annotates_only_what_it_declares[template]" in ids
    assert "test_conformance.py::TestConformance::test_the_plugin_loads" in ids


def test_the_declared_capabilities_of_the_template_pass(pytester, run):
    pytester.makepyfile(
        test_conformance="""
        from pytest_quantweave import conformance_suite

        TestConformance = conformance_suite("quantweave_contrib_template.plugin", name="template")
        """
    )
    result = run("-k", "capability or plugin_loads")
    result.assert_outcomes(passed=len(TEMPLATE_CAPABILITIES) + 1)


def test_a_capability_the_quantizer_does_not_deliver_fails_its_own_item(pytester, run):
    pytester.makepyfile(broken_plugin=BROKEN_PLUGIN)
    pytester.makepyfile(
        test_conformance="""
        from pytest_quantweave import conformance_suite

        TestConformance = conformance_suite("broken_plugin", name="broken")
        """
    )
    result = run("-k", "capability")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED *test_each_declared_capability_is_delivered?broken-linear_relu-static?*"])
    failure = result.stdout.str()
    assert "broken:broken [linear_relu, static]" in failure  # the quantizer, the pattern, the mode
    assert "relu" in failure.split("broken:broken [linear_relu, static]", 1)[1]


def test_a_plugin_that_does_not_load_fails_saying_why(pytester, run):
    pytester.makepyfile(
        test_conformance="""
        from pytest_quantweave import conformance_suite

        TestConformance = conformance_suite("no_such_module.plugin")
        """
    )
    result = run("-k", "plugin_loads or capability")
    result.assert_outcomes(failed=1, errors=1)  # the capability item fails at set-up
    out = result.stdout.str()
    assert "no_such_module.plugin" in out and "did not load" in out
    assert "did-not-load" in out  # the capability item's id says so too


def test_an_entry_point_name_that_is_not_installed_is_named(pytester, run):
    pytester.makepyfile(
        test_conformance="""
        from pytest_quantweave import conformance_suite

        TestConformance = conformance_suite("not-installed-plugin")
        """
    )
    result = run("-k", "plugin_loads")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "'not-installed-plugin'" in out and "entry point" in out and "module" in out


def test_a_test_that_names_no_plugin_is_a_usage_error_naming_the_marker_and_the_ini_option(pytester, run):
    pytester.makepyfile(test_x="def test_it(quantweave_capability):\n    pass\n")
    result = run()
    assert result.ret != 0
    err = result.stderr.str() + result.stdout.str()
    assert "test_x.py::test_it" in err and "quantweave_plugin" in err and "ini option" in err


def test_the_ini_option_and_the_fixtures_for_own_tests(pytester, run):
    pytester.makeini("[pytest]\nquantweave_plugin = quantweave_contrib_template.plugin\n")
    pytester.makepyfile(
        test_own="""
        import quantweave as qw

        def test_info(quantweave_quantizer_info):
            assert quantweave_quantizer_info.name == "template"

        def test_quantizer(quantweave_quantizer):
            assert isinstance(quantweave_quantizer, qw.Quantizer)

        def test_plugin(quantweave_plugin):
            assert set(quantweave_plugin.infos) == {"template"} and not quantweave_plugin.error
        """
    )
    result = run("-v")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        ["*test_quantizer?template-dynamic? PASSED*", "*test_quantizer?template-static? PASSED*"]
    )


def test_the_closest_marker_names_the_plugin(pytester, run):
    pytester.makeini("[pytest]\nquantweave_plugin = no_such_module.plugin\n")
    pytester.makepyfile(
        test_own="""
        import pytest

        @pytest.mark.quantweave_plugin("quantweave_contrib_template.plugin", name="tpl")
        def test_marked(quantweave_plugin):
            assert quantweave_plugin.name == "tpl" and not quantweave_plugin.error

        def test_ini(quantweave_plugin):
            assert quantweave_plugin.error and "no_such_module" in quantweave_plugin.error
        """
    )
    run().assert_outcomes(passed=2)


def test_probes_are_exported_once_per_session_and_handed_out_as_copies(pytester, run):
    test = """
        def test_{n}(quantweave_probes):
            probe = quantweave_probes.get("conv2d")
            assert quantweave_probes.exports == 1
            for node in probe.graph_module.graph.nodes:
                assert "scribbled" not in node.meta
                node.meta["scribbled"] = True  # a copy: the next test must not see this
            probe.model.conv.weight.data.zero_()
            assert quantweave_probes.get("conv2d").model.conv.weight.abs().sum() > 0
        """
    pytester.makepyfile(test_a=test.format(n="a"), test_b=test.format(n="b"))
    run().assert_outcomes(passed=2)


def test_tests_that_use_no_quantweave_fixture_are_untouched(pytester, run):
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = run("-v")
    result.assert_outcomes(passed=1)
    assert "quantweave" not in "".join(line for line in result.outlines if "::" in line)


@pytest.mark.parametrize("name", ["models", "digits", "reference"])
def test_the_old_import_paths_are_the_kit_modules(name):
    import importlib

    assert importlib.import_module(f"quantweave.testing.{name}") is importlib.import_module(f"pytest_quantweave.{name}")


def test_the_plugin_module_itself_can_be_given(pytester, run):
    pytester.makepyfile(
        test_conformance="""
        from pytest_quantweave import conformance_suite
        from quantweave_contrib_template import plugin

        TestConformance = conformance_suite(plugin, name="tpl")
        """
    )
    result = run("--collect-only", "-q")
    assert "test_conformance.py::TestConformance::test_the_quantizer_annotates_only_what_it_declares[template]" in (
        result.outlines
    )
    assert any("[template-linear-dynamic]" in line for line in result.outlines)

"""The template passes quantweave's conformance kit: it does exactly what it declares."""

import pytest

from quantweave.testing.conformance import assert_plugin_conforms, capability_cases, check_capability
from quantweave_contrib_template import plugin

(INFO,) = plugin.quantweave_quantizers()


@pytest.mark.parametrize("cap", capability_cases(INFO))
def test_each_declared_capability_is_delivered(cap):
    assert check_capability(INFO, cap, plugin="template") == []


def test_the_plugin_conforms_as_a_whole():
    # loads the plugin module as the registry would, checks every quantizer, both declaration
    # channels, and that nothing undeclared is annotated on any probe of the vocabulary
    assert_plugin_conforms(plugin, name="template")

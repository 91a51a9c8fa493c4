"""The template passes quantweave's conformance kit: it does exactly what it declares."""

import pytest
from qw_fixture_api1 import plugin

from quantweave.testing.conformance import assert_conforms, capability_cases, check_capability

(INFO,) = plugin.quantweave_quantizers()


@pytest.mark.parametrize("cap", capability_cases(INFO))
def test_each_declared_capability_is_delivered(cap):
    assert check_capability(INFO, cap, plugin="api1") == []


def test_nothing_undeclared_is_annotated():
    assert_conforms(INFO, plugin="api1")

"""quantweave-litert passes quantweave's conformance kit: it does exactly what it declares
(every stated field on each pattern's probe, nothing annotated where no declared pattern
occurs on any probe or on the vocabulary sweep model, both declaration channels agree)."""

import pytest
from quantweave_litert import plugin

from quantweave.testing.conformance import assert_plugin_conforms, capability_cases, check_capability

(INFO,) = plugin.quantweave_quantizers()


@pytest.mark.parametrize("cap", capability_cases(INFO))
def test_each_declared_capability_is_delivered(cap):
    assert check_capability(INFO, cap, plugin="litert") == []


def test_the_plugin_conforms_as_a_whole():
    assert_plugin_conforms(plugin, name="litert")


def test_declared_patterns_are_the_litert_scheme():
    static = {c.pattern for c in INFO.capabilities if c.mode.value == "static"}
    assert static == {
        "conv2d",
        "conv2d_relu",
        "linear",
        "linear_relu",
        "add",
        "add_relu",
        "mul",
        "cat",
        "sigmoid",
        "softmax",
        "max_pool2d",
        "adaptive_avg_pool2d",
        "flatten",
        "reshape",
        "view",
    }
    assert {(c.pattern, c.mode.value) for c in INFO.capabilities if c.mode.value != "static"} == {
        ("linear", "weight_only")
    }
    fixed = {c.pattern: c.output for c in INFO.capabilities if c.output is not None and c.output.kind == "fixed"}
    assert set(fixed) == {"sigmoid", "softmax"}
    assert all(q.scale == 1 / 256 and q.zero_point == -128 for q in fixed.values())
    assert {c.pattern for c in INFO.capabilities if c.output is not None and c.output.kind == "shared"} == {
        "cat",
        "max_pool2d",
        "adaptive_avg_pool2d",
        "flatten",
        "reshape",
        "view",
    }

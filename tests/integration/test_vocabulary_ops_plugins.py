"""The vocabulary's ops in the capability table of a real composition (x86, xnnpack): moved from
tests/core/test_vocabulary_ops.py so that tests/core runs without plugins."""

import quantweave as qw


def test_xnnpack_serves_relu_after_a_cat_in_the_capability_table():
    import quantweave_xnnpack  # noqa: F401 - registers the plugin

    composed = qw.ComposableQuantizer([qw.get_quantizer("x86"), qw.get_quantizer("xnnpack")])
    rows = {row.pattern: row for row in composed.capability_table()}
    for pattern in ("relu", "hardtanh", "relu6"):
        assert rows[pattern].served_as == ((composed.labels[1], pattern),), rows[pattern]

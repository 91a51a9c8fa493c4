"""The first-party quantizers' repr: moved from tests/core/test_registry.py so that tests/core runs
without plugins."""

import pytest


def test_quantizers_have_a_repr_with_their_name_and_configuration():
    template = pytest.importorskip("quantweave_contrib_template.quantizer")
    assert repr(template.TemplateQuantizer()) == "TemplateQuantizer(name='template', is_dynamic=False)"
    assert repr(template.TemplateQuantizer(is_dynamic=True)) == "TemplateQuantizer(name='template', is_dynamic=True)"
    x86 = pytest.importorskip("quantweave_x86")
    assert repr(x86.X86InductorQuantizer(reduce_range=True)).startswith(
        "X86InductorQuantizer(name='x86', global=default(static, reduce_range), reduce_range=True"
    )

"""The public surface by audience: users' names in quantweave, authors' in plugin_api / authoring,
test authors' in quantweave.testing; the names that moved still resolve for one release, warning."""

from __future__ import annotations

import importlib
import warnings

import pytest

import quantweave as qw
from quantweave._modules.surface import MOVED
from tests.helpers import assert_names

USERS = {
    "prepare_pt2e",
    "prepare_qat_pt2e",
    "calibrate",
    "convert_pt2e",
    "save",
    "load",
    "annotation_report",
    "get_quantizer",
    "ComposableQuantizer",
    "compare",
    "fallback",
    "QuantizationSpec",
    "QuantizationConfig",
    "QuantizationAnnotation",
    "SharedQuantizationSpec",
    "Quantizer",
    "AnnotationError",
    "MisuseWarning",
}


def test_the_top_level_is_the_users_api():
    assert set(qw.__all__) >= USERS
    assert not set(MOVED) & set(qw.__all__)
    for name in qw.__all__:
        assert getattr(qw, name) is not None, name
    assert len(qw.__all__) < 59  # it held 59 names for three audiences


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_name_still_resolves_with_a_warning_naming_its_new_home(name):
    home = importlib.import_module(MOVED[name])
    with pytest.warns(DeprecationWarning) as caught:
        old = getattr(qw, name)
    assert_names(caught, f"quantweave.{name}", f"{MOVED[name]}.{name}")
    assert old is getattr(home, name)
    assert name in home.__all__


def test_from_import_of_a_moved_name_warns_too():
    with pytest.warns(DeprecationWarning, match="quantweave.plugin_api.hookimpl"):
        from quantweave import hookimpl  # noqa: F401


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="no_such_name"):
        qw.no_such_name  # noqa: B018


def test_the_new_homes_import_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from quantweave.authoring import annotate_input_qspec_map, quantize_ops  # noqa: F401
        from quantweave.plugin_api import Capability, hookimpl, is_annotated  # noqa: F401
        from quantweave.testing import PluginManager  # noqa: F401

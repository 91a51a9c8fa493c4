"""tests.helpers.assert_names: passes when the message names every thing given, fails naming what is missing."""

import warnings

import pytest

from tests.helpers import assert_names


def test_assert_names_reads_exceptions_and_warnings():
    with pytest.raises(ValueError) as info:
        raise ValueError("node 'conv' has ch_axis=3: use 0 or 1")
    assert_names(info, "'conv'", "ch_axis", 3, "use 0 or 1")
    with pytest.warns(UserWarning) as caught:
        warnings.warn("first", UserWarning, stacklevel=1)
        warnings.warn("option 'layer.0' names no module", UserWarning, stacklevel=1)
    assert_names(caught, "'layer.0'", "no module")


def test_assert_names_fails_naming_what_the_message_lacks():
    with pytest.raises(AssertionError) as failure:
        assert_names(ValueError("node 'conv' is bad"), "'conv'", "ch_axis")
    assert "ch_axis" in str(failure.value) and "node 'conv' is bad" in str(failure.value)
    with pytest.raises(AssertionError):  # every name in one warning, not spread over several
        assert_names(["a names x", "b names y"], "x", "y")

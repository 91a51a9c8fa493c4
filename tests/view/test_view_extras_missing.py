"""Without the extras, quantweave.view says which extra to install (runs everywhere)."""

import sys

import pytest

from quantweave import view
from quantweave.numerics import NumericsReport


def test_missing_model_explorer_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "model_explorer", None)
    with pytest.raises(ImportError, match=r"quantweave\[view\]"):
        view.overlays(object(), NumericsReport(()))


def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"quantweave\[plots\]"):
        view.plot_sqnr(NumericsReport(()), object(), tmp_path / "x.png")

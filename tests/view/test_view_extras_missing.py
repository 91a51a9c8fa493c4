"""Without the extras, quantweave.view says which extra to install (runs everywhere)."""

import subprocess
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


def test_quantweave_view_is_an_attribute_imported_on_first_use(tmp_path):
    code = (
        "import sys, quantweave\n"
        "heavy = [m for m in ('quantweave.view', 'model_explorer', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "view = quantweave.view\n"
        "import quantweave.view as module\n"
        "assert view is module and callable(view.serve) and callable(view.plot_fallback), view\n"
        "assert 'model_explorer' not in sys.modules and 'matplotlib' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr

"""Release hygiene of the installed (non-editable) distributions (tox env `plugins`).

Each first-party distribution ships the license text in its dist-info (PEP 639), marks
its package as typed (PEP 561 ``py.typed``), takes its version from the package's
``__version__`` and declares its license expression and supported Python range.
"""

import importlib
import importlib.metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.installed

ROOT = Path(__file__).resolve().parents[2]

#: distribution name -> the import package it ships
DISTRIBUTIONS = {
    "quantweave": "quantweave",
    "quantweave-x86": "quantweave_x86",
    "quantweave-contrib-template": "quantweave_contrib_template",
}


def _distribution(name):
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed (tox -e plugins installs it)")
    files = dist.files or []
    # An editable install ships only a .pth/finder, not the package: nothing to check here.
    if not any(f.parts[0] == DISTRIBUTIONS[name] for f in files):
        pytest.skip(f"{name} is installed editable; this checks the built wheel (tox -e plugins)")
    return dist


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_wheel_ships_the_license_in_its_dist_info(name):
    dist = _distribution(name)
    licenses = [f for f in dist.files if len(f.parts) == 3 and f.parts[0].endswith(".dist-info")]
    licenses = [f for f in licenses if f.parts[1] == "licenses" and f.parts[2] == "LICENSE"]
    assert licenses, f"{name}: no <dist>.dist-info/licenses/LICENSE among {sorted(map(str, dist.files))}"
    text = licenses[0].read_text(encoding="utf-8")
    assert text == (ROOT / "LICENSE").read_text(encoding="utf-8"), f"{name} ships a LICENSE differing from the root's"
    assert dist.metadata.get_all("License-File") == ["LICENSE"]


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_wheel_ships_py_typed(name):
    dist = _distribution(name)
    package = DISTRIBUTIONS[name]
    typed = [f for f in dist.files if f.parts == (package, "py.typed")]
    assert typed, f"{name}: {package}/py.typed is not in the installed files"
    assert typed[0].locate().is_file()


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_metadata_version_is_the_package_version(name):
    dist = _distribution(name)
    module = importlib.import_module(DISTRIBUTIONS[name])
    assert dist.metadata["Version"] == module.__version__
    # the module imported is the installed one, not a source tree shadowing it
    assert Path(module.__file__).resolve() == Path(dist.locate_file(f"{DISTRIBUTIONS[name]}/__init__.py")).resolve()


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_license_expression_and_requires_python(name):
    meta = _distribution(name).metadata
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert not [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")], (
        "PEP 639: no License classifiers alongside a license expression"
    )
    assert meta["Requires-Python"], f"{name} declares no Requires-Python"
    assert "Typing :: Typed" in (meta.get_all("Classifier") or [])

"""Tox env ``publish``: a scaffold-generated plugin (quantweave-acme) and quantweave-litert,
built as wheels and installed with the core and quantweave-x86 (tests/publish/build.py),
work together as installed distributions:

- what is imported is the installed wheels, not the repository sources;
- every wheel passes ``twine check`` and ships its LICENSE, ``py.typed`` and entry point;
  the core wheel ships the scaffold templates;
- the registry loads the three plugins from their entry points; composed (acme, litert,
  x86), the capability table holds on the probes (``check_composition``) and a model
  quantized by the composition converts and runs, each member claiming what it declares;
- the generated project's tox.ini, as ``tox config`` reads it, installs quantweave from the checkout
  in its env ``source``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.publish

REPO = Path(__file__).resolve().parents[2]
DIST = Path(os.environ.get("QUANTWEAVE_PUBLISH_DIST", "")) if os.environ.get("QUANTWEAVE_PUBLISH_DIST") else None
WHEELS = {
    "quantweave": ("quantweave", None),
    "pytest_quantweave": ("pytest_quantweave", None),
    "quantweave_x86": ("quantweave_x86", "x86"),
    "quantweave_litert": ("quantweave_litert", "litert"),
    "quantweave_acme": ("quantweave_acme", "acme"),
}


@pytest.fixture(scope="module")
def dist():
    if DIST is None or not DIST.is_dir():
        pytest.skip("needs the wheels tests/publish/build.py builds (tox -e publish)")
    return DIST


def wheel(dist, stem):
    (path,) = dist.glob(f"{stem}-*.whl")
    return path


@pytest.mark.parametrize("package", ["quantweave", "quantweave_x86", "quantweave_litert", "quantweave_acme"])
def test_the_installed_wheels_are_imported_not_the_sources(package, dist):
    module = __import__(package)
    location = Path(module.__file__).resolve()
    assert "site-packages" in location.parts, location
    assert REPO / "core" not in location.parents and REPO / "contrib" not in location.parents


def test_every_distribution_passes_twine_check(dist):
    files = sorted(dist.glob("*.whl")) + sorted(dist.glob("*.tar.gz"))
    assert {f.name.split("-")[0] for f in files} == set(WHEELS)
    assert any(f.name.startswith("quantweave_acme-") and f.name.endswith(".tar.gz") for f in files)
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, files)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("stem", list(WHEELS))
def test_each_wheel_ships_license_types_and_entry_point(stem, dist):
    package, entry_point = WHEELS[stem]
    names = zipfile.ZipFile(wheel(dist, stem)).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert f"{package}/py.typed" in names
    if entry_point is not None:
        (eps,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = zipfile.ZipFile(wheel(dist, stem)).read(eps).decode()
        assert f"[quantweave]\n{entry_point} = {package}.plugin" in text


def test_the_core_wheel_ships_the_scaffold_templates(dist):
    from quantweave.scaffold import _FILES

    names = set(zipfile.ZipFile(wheel(dist, "quantweave")).namelist())
    assert {f"quantweave/_scaffold/{t}" for t in _FILES.values() if t} <= names


def test_the_registry_loads_the_published_plugins(dist):
    import quantweave as qw

    records = {r.name: r for r in qw.plugins()}
    for name, dist_name in (("acme", "quantweave-acme"), ("litert", "quantweave-litert"), ("x86", "quantweave-x86")):
        assert records[name].status == "loaded", records[name].error
        assert records[name].distribution == dist_name
        assert records[name].api == 2


def test_the_three_plugins_compose(dist):
    import quantweave as qw
    from quantweave.plugin_api import ANNOTATED_BY_KEY
    from quantweave.testing.conformance import check_composition

    composed = qw.ComposableQuantizer([qw.get_quantizer(name) for name in ("acme", "litert", "x86")])
    assert check_composition(composed) == []
    served = {(row.pattern, row.mode.value): row.served_by for row in composed.capability_table()}
    assert served[("conv2d", "static")] == "acme"  # first member wins what it declares
    assert served[("sigmoid", "static")] == "litert"  # only litert declares it
    assert served[("conv2d_add", "static")] == "acme"  # acme's conv2d claims x86's conv2d_add anchor

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            a = F.relu(self.conv(x))
            a = a * torch.sigmoid(a)
            return self.fc(F.adaptive_avg_pool2d(a, 1).flatten(1))

    model, x = Model().eval(), torch.randn(2, 3, 12, 12)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), composed)
    claimed = {str(n.target): n.meta.get(ANNOTATED_BY_KEY) for n in prepared.graph.nodes if n.op == "call_function"}
    assert claimed["aten.conv2d.default"] == claimed["aten.linear.default"] == "acme"
    assert claimed["aten.sigmoid.default"] == claimed["aten.mul.Tensor"] == "litert"
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    torch.testing.assert_close(converted(x), model(x), atol=0.1, rtol=0)


def test_the_kit_wheel_is_a_pytest_plugin_with_the_reference_material_the_core_wheel_leaves_out(dist):
    kit = zipfile.ZipFile(wheel(dist, "pytest_quantweave"))
    (eps,) = [n for n in kit.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "[pytest11]\nquantweave = pytest_quantweave.plugin" in kit.read(eps).decode()
    core = zipfile.ZipFile(wheel(dist, "quantweave"))
    for name in ("models", "digits", "reference"):
        assert f"pytest_quantweave/{name}.py" in kit.namelist()
        stub = core.read(f"quantweave/testing/{name}.py").decode()  # only the stub pointing at the kit
        assert f'moved_to_kit("{name}")' in stub and len(stub) < 1000


def test_the_generated_tox_ini_installs_quantweave_from_the_checkout(dist, tmp_path):
    """The generated project's tox.ini, as tox reads it (``tox config``, no env made): its default env
    builds and installs the project's wheel with its test extra and runs pytest; env ``source`` (its
    README's ``QUANTWEAVE_SOURCE=... tox -e source``) adds the core and pytest-quantweave from the
    checkout. The tests themselves run once, through the README's Develop block (test_develop_block.py)."""
    project = dist.parent / "quantweave-acme"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOX_")}
    env["QUANTWEAVE_SOURCE"] = str(REPO)
    keys = ["package", "extras", "deps", "commands", "pass_env"]
    done = subprocess.run(
        [sys.executable, "-m", "tox", "-c", str(project), "config", "-e", "py311,source", "-k", *keys,
         "--workdir", str(tmp_path / "tox")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    sections = dict((part.split("]", 1)[0], part.split("]", 1)[1]) for part in done.stdout.split("[testenv:")[1:])
    assert set(sections) == {"py311", "source"}, done.stdout
    for name, text in sections.items():
        assert "package = wheel" in text and "extras = test" in text, f"tox env {name} of {project}:\n{text}"
        assert "commands = pytest" in text and "torch==2.13.0" in text, f"tox env {name} of {project}:\n{text}"
    for checkout_dist in ("core", "pytest-quantweave"):
        assert f"\n  {REPO / checkout_dist}\n" in sections["source"], f"env source lacks {checkout_dist}:\n{sections}"
        assert str(REPO / checkout_dist) not in sections["py311"], sections["py311"]
    assert "QUANTWEAVE_SOURCE" in sections["source"], sections["source"]

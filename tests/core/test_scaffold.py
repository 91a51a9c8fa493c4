"""``quantweave new-plugin``: the generated project is complete, imports only the plugin
contract, targets the current plugin API, and its plugin passes the conformance kit as
generated (imported from the generated directory, in-process). Installing it, running its
own tests and building its wheel is the tox env ``publish`` (tests/publish); its conformance
test run by pytest with quantweave's DeprecationWarnings made errors is the tox env
``plugins`` (pytest-quantweave/tests/fresh_venv.py runs contrib/template's, which is this
scaffold's output, tests/core/test_scaffold_template.py)."""

import ast
import importlib
import sys
import tomllib
import warnings
from importlib import resources

import pytest

from quantweave._modules.surface import MOVED
from quantweave.cli import main
from quantweave.plugin_api import PLUGIN_API_RELEASES, PLUGIN_API_VERSION
from quantweave.scaffold import _FILES, ScaffoldError, new_plugin, plugin_names
from quantweave.testing.conformance import assert_plugin_conforms
from tests.helpers import assert_names

EXPECTED = {
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "tox.ini",
    ".gitignore",
    "src/quantweave_scaffold_probe/__init__.py",
    "src/quantweave_scaffold_probe/plugin.py",
    "src/quantweave_scaffold_probe/quantizer.py",
    "src/quantweave_scaffold_probe/py.typed",
    "tests/test_conformance.py",
}
NAME = "scaffold-probe"


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "probe"
    written = new_plugin(NAME, root)
    return root, written


@pytest.fixture
def generated_package(project):
    root, _ = project
    sys.path.insert(0, str(root / "src"))
    try:
        yield importlib.import_module("quantweave_scaffold_probe.plugin")
    finally:
        sys.path.remove(str(root / "src"))
        for module in [m for m in sys.modules if m.startswith("quantweave_scaffold_probe")]:
            del sys.modules[module]


def test_the_project_has_every_file(project):
    root, written = project
    assert {p.relative_to(root).as_posix() for p in written} == EXPECTED
    assert {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} == EXPECTED


def test_the_names_follow_the_plugin_name():
    names = plugin_names("my-npu")
    assert (names.name, names.dist, names.package, names.class_name) == (
        "my-npu",
        "quantweave-my-npu",
        "quantweave_my_npu",
        "MyNpuQuantizer",
    )


def test_pyproject_declares_the_entry_point_the_range_and_the_packaging(project):
    root, _ = project
    data = tomllib.loads((root / "pyproject.toml").read_text())
    release = PLUGIN_API_RELEASES[PLUGIN_API_VERSION][0]
    assert data["build-system"] == {"requires": ["hatchling>=1.27"], "build-backend": "hatchling.build"}
    project_table = data["project"]
    assert project_table["name"] == "quantweave-scaffold-probe"
    assert project_table["dependencies"] == [f"quantweave>={release},<0.2"]
    assert project_table["entry-points"] == {"quantweave": {NAME: "quantweave_scaffold_probe.plugin"}}
    assert project_table["license-files"] == ["LICENSE"]
    assert project_table["requires-python"] == ">=3.11"
    assert project_table["dynamic"] == ["version"]
    hatch = data["tool"]["hatch"]
    assert hatch["version"] == {"path": "src/quantweave_scaffold_probe/__init__.py"}
    assert hatch["build"]["targets"]["wheel"]["packages"] == ["src/quantweave_scaffold_probe"]
    assert "torch==2.13.0" in (root / "tox.ini").read_text().split()
    assert "PLACEHOLDER" in (root / "LICENSE").read_text()


def test_the_package_imports_only_the_plugin_contract(project):
    root, _ = project
    # quantweave.authoring: the kit the quantizer is written on (rule table, op matching, annotating)
    allowed = {"quantweave", "quantweave.plugin_api", "quantweave.authoring", "quantweave.observers"}
    for path in (root / "src").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                if module.split(".")[0] == "quantweave":
                    assert module in allowed, f"{path.name} imports {module}"


def test_the_generated_plugin_targets_the_current_api_and_conforms(generated_package):
    assert generated_package.QUANTWEAVE_PLUGIN_API == PLUGIN_API_VERSION
    (info,) = generated_package.quantweave_quantizers()
    assert info.name == NAME
    assert {(c.pattern, c.mode.value) for c in info.capabilities} == {
        ("conv2d", "static"),
        ("conv2d_relu", "static"),
        ("linear", "static"),
        ("linear_relu", "static"),
        ("linear", "dynamic"),
    }
    # the full form: every field the kit checks is stated
    for cap in info.capabilities:
        assert None not in (cap.activation, cap.weight, cap.output, cap.bias), cap
    assert_plugin_conforms(generated_package, name=NAME)


def test_the_generated_code_uses_no_deprecated_name(project):
    """Nothing the scaffold writes reads a name that left quantweave's top level."""
    root, _ = project
    for path in (root / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("qw", "quantweave")
            ):
                assert node.attr not in MOVED, f"{path.name} reads the deprecated quantweave.{node.attr}"
            if isinstance(node, ast.ImportFrom) and node.module == "quantweave":
                used = {alias.name for alias in node.names} & set(MOVED)
                assert not used, f"{path.name} imports the deprecated {sorted(used)} from quantweave"


def _quantweave_deprecations(caught):
    return [
        str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and "quantweave" in str(w.message)
    ]


def test_importing_and_using_the_generated_plugin_emits_no_quantweave_deprecation(project, generated_package):
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantizer_module = importlib.reload(importlib.import_module("quantweave_scaffold_probe.quantizer"))
        importlib.reload(generated_package)
        (info,) = generated_package.quantweave_quantizers()
        model = torch.export.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.randn(2, 4),))
        for options in ({}, *info.mode_options.values()):
            info.factory(**options).annotate(model.module())
            info.factory(**options).quantization_capabilities()
    assert info.capabilities == quantizer_module.CAPABILITIES
    assert not _quantweave_deprecations(caught)


def test_the_generated_tests_call_the_kit(project):
    """The whole conformance test is one line through pytest-quantweave (its test extra)."""
    root, _ = project
    text = (root / "tests" / "test_conformance.py").read_text()
    code = [line for line in text.splitlines() if line and not line.startswith(("#", '"""')) and "import" not in line]
    assert code[-1] == 'TestConformance = conformance_suite("quantweave_scaffold_probe.plugin")'
    assert "from pytest_quantweave import conformance_suite" in text
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("pytest-quantweave") for r in extras["test"])


@pytest.mark.parametrize("taken", ["x86", "xnnpack", "embedding", "executorch", "onnxruntime", "vendors", "litert"])
def test_the_name_of_a_first_party_plugin_is_refused_unless_forced(taken, tmp_path):
    with pytest.raises(ScaffoldError) as info:
        new_plugin(taken, tmp_path / "out")
    message = str(info.value)
    assert repr(taken) in message and f"quantweave-{taken}" in message and "--force" in message
    assert not (tmp_path / "out").exists()
    assert new_plugin(taken, tmp_path / "forced", force=True)


def test_the_cli_refuses_a_first_party_name_and_takes_force(tmp_path, capsys):
    assert main(["new-plugin", "x86", "--dir", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "'x86'" in err and "--force" in err
    assert main(["new-plugin", "x86", "--force", "--dir", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "pyproject.toml").is_file()


def test_the_develop_block_and_tox_install_quantweave_from_a_checkout(project):
    """No package index has quantweave yet: the README's Develop block installs the core and
    pytest-quantweave from QUANTWEAVE_SOURCE, and tox has an env `source` doing the same."""
    root, _ = project
    readme = (root / "README.md").read_text()
    develop = readme.split("## Develop", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert '"$QUANTWEAVE_SOURCE/core" "$QUANTWEAVE_SOURCE/pytest-quantweave"' in develop
    assert "export QUANTWEAVE_SOURCE=" in develop
    tox = (root / "tox.ini").read_text()
    assert "source: {env:QUANTWEAVE_SOURCE:QUANTWEAVE_SOURCE-is-not-set}/core" in tox
    assert "source: {env:QUANTWEAVE_SOURCE:QUANTWEAVE_SOURCE-is-not-set}/pytest-quantweave" in tox
    assert "passenv = QUANTWEAVE_SOURCE" in tox and "extras = test" in tox


@pytest.mark.parametrize(
    "bad",
    ["Acme", "1acme", "my npu", "a--b", "acme-", "_acme", "acme.x", "", "x" * 41, "quantweave-acme"],
)
def test_a_bad_name_is_refused_saying_what_is_allowed(bad, tmp_path):
    with pytest.raises(ScaffoldError) as info:
        new_plugin(bad, tmp_path / "out")
    assert_names(info, "plugin name", repr(bad))
    assert "lower-case" in str(info.value) or "own name" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_an_existing_non_empty_directory_is_not_overwritten(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ScaffoldError) as info:
        new_plugin("acme", tmp_path)
    assert_names(info, str(tmp_path), "not empty", "--dir")
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert new_plugin("acme", empty)


def test_the_cli_generates_and_reports_errors(tmp_path, capsys):
    assert main(["new-plugin", "acme", "--dir", str(tmp_path / "acme")]) == 0
    out = capsys.readouterr().out
    assert "created quantweave-acme" in out and "src/quantweave_acme/plugin.py" in out
    assert main(["new-plugin", "acme", "--dir", str(tmp_path / "acme")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["new-plugin", "Bad Name", "--dir", str(tmp_path / "bad")]) == 2
    assert "invalid plugin name 'Bad Name'" in capsys.readouterr().err


def test_the_default_directory_is_named_after_the_distribution(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["new-plugin", "acme"]) == 0
    assert (tmp_path / "quantweave-acme" / "pyproject.toml").is_file()


def test_every_template_is_package_data():
    shipped = {p.name for p in resources.files("quantweave._scaffold").iterdir()}
    assert {t for t in _FILES.values() if t} <= shipped

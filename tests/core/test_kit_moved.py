"""The reference models, digits loader and reference quantizer live in pytest-quantweave:
their old paths (quantweave.testing.models / .digits / .reference) are those modules while
it is installed, and without it fail with an ImportError naming what to install."""

import subprocess
import sys

import pytest

NAMES = ["models", "digits", "reference"]
BLOCKED = """
import importlib, sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "pytest_quantweave" or name.startswith("pytest_quantweave."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Block())
import quantweave, quantweave.testing.conformance  # the core and its kit functions import without it
for name in sys.argv[1:]:
    try:
        importlib.import_module("quantweave.testing." + name)
    except ImportError as exc:
        print(name, "|", type(exc).__name__, "|", exc)
    else:
        print(name, "|", "imported", "|")
"""


@pytest.fixture(scope="module")
def without_the_kit() -> dict[str, tuple[str, str]]:
    """One interpreter with pytest_quantweave blocked tries each old path in turn (an import that
    fails leaves nothing behind, so each try is as in a fresh interpreter): name -> (kind, message)."""
    done = subprocess.run([sys.executable, "-c", BLOCKED, *NAMES], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = {}
    for line in done.stdout.splitlines():
        name, kind, message = line.split(" | ", 2)
        out[name] = (kind, message)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_without_the_kit_the_old_path_names_pip_install_pytest_quantweave(name, without_the_kit):
    kind, message = without_the_kit[name]
    assert kind == "ModuleNotFoundError"  # an ImportError: importorskip and `except ImportError` see it
    assert f"quantweave.testing.{name}" in message and "pip install pytest-quantweave" in message
    assert f"pytest_quantweave.{name}" in message


@pytest.mark.parametrize("name", NAMES)
def test_with_the_kit_the_old_path_is_the_kit_module(name):
    import importlib

    kit = pytest.importorskip(f"pytest_quantweave.{name}")
    assert importlib.import_module(f"quantweave.testing.{name}") is kit

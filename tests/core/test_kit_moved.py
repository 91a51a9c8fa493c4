"""The reference models, digits loader and reference quantizer live in pytest-quantweave:
their old paths (quantweave.testing.models / .digits / .reference) are those modules while
it is installed, and without it fail with an ImportError naming what to install."""

import subprocess
import sys

import pytest

BLOCKED = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "pytest_quantweave" or name.startswith("pytest_quantweave."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Block())
import quantweave, quantweave.testing.conformance  # the core and its kit functions import without it
try:
    import quantweave.testing.%s
except ImportError as exc:
    print(type(exc).__name__, "|", exc)
"""


@pytest.mark.parametrize("name", ["models", "digits", "reference"])
def test_without_the_kit_the_old_path_names_pip_install_pytest_quantweave(name):
    done = subprocess.run([sys.executable, "-c", BLOCKED % name], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    kind, _, message = done.stdout.strip().partition(" | ")
    assert kind == "ModuleNotFoundError"  # an ImportError: importorskip and `except ImportError` see it
    assert f"quantweave.testing.{name}" in message and "pip install pytest-quantweave" in message
    assert f"pytest_quantweave.{name}" in message


@pytest.mark.parametrize("name", ["models", "digits", "reference"])
def test_with_the_kit_the_old_path_is_the_kit_module(name):
    import importlib

    kit = pytest.importorskip(f"pytest_quantweave.{name}")
    assert importlib.import_module(f"quantweave.testing.{name}") is kit

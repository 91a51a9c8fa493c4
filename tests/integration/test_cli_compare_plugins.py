"""quantweave compare with an installed plugin (x86): moved from tests/core/test_cli_compare.py so that
tests/core runs without plugins."""

import subprocess
import sys

import pytest


def test_the_installed_command_compares_with_a_plugin(tmp_path):
    """The console script with the real plugin registry (x86 is installed with the core's tests)."""
    pytest.importorskip("quantweave_x86")
    result = subprocess.run(
        [sys.executable, "-m", "quantweave", "compare", "tests.core.test_cli_compare:build", "--quantizer", "x86"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "quantized by x86" in result.stdout and "numerics: " in result.stdout

"""Issue #26: a scaffolded project installs and tests from a checkout of quantweave, with no
package index holding quantweave, exactly as its README's "Develop" block says.

A fresh-clone-like copy of this repository (the files git tracks or would track, nothing
built) is QUANTWEAVE_SOURCE; ``quantweave new-plugin acme`` generates the project beside it;
the README's Develop block runs verbatim in bash from the project's directory: a venv, torch
2.13.0, the core and pytest-quantweave from the copy, the project editable with its test
extra, ``quantweave plugins``, ``quantweave capabilities`` and ``pytest`` (the conformance
kit through pytest-quantweave). Slow (a venv and installs): tox env ``publish``.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.publish

REPO = Path(__file__).resolve().parents[2]


def _clone_like(target: Path) -> None:
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        source = REPO / relative
        if source.is_file():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / relative)


def _develop_block(readme: str) -> str:
    section = readme.split("## Develop", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_the_generated_readme_develop_block_runs_from_a_checkout(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout of quantweave")
    checkout = tmp_path / "quantweave"
    _clone_like(checkout)
    project = tmp_path / "quantweave-acme"
    subprocess.run([sys.executable, "-m", "quantweave", "new-plugin", "acme", "--dir", str(project)], check=True)
    block = _develop_block((project / "README.md").read_text())
    assert "QUANTWEAVE_SOURCE" in block
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "TOX_"))}
    env["QUANTWEAVE_SOURCE"] = str(checkout)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=project, env=env, capture_output=True, text=True, timeout=1800
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "acme" in out and "loaded" in out, out[-3000:]
    assert " passed" in out and " failed" not in out, out[-3000:]
    (stub,) = (project / ".venv" / "lib").glob("python*/site-packages/quantweave/testing/models.py")
    assert "class " not in stub.read_text(), "the core carries the reference models (they belong to pytest-quantweave)"

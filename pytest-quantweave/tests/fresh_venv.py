"""Proof of issue #23: a third-party-style plugin's whole conformance test runs through the
pytest plugin in a fresh venv holding only torch 2.13.0, the core, pytest-quantweave and
the plugin (contrib/template), all installed from this checkout, non-editable.

``python pytest-quantweave/tests/fresh_venv.py VENV_DIR`` (the tox env ``plugins`` runs it):
creates VENV_DIR, installs the four, checks that no other quantweave distribution and no
other pytest plugin is there, copies contrib/template/tests out of the checkout and runs
them with the venv's pytest (which loads pytest-quantweave through its ``pytest11`` entry
point), with quantweave's DeprecationWarnings made errors. Exits non-zero when anything fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {"quantweave", "pytest-quantweave", "quantweave-contrib-template"}
#: a DeprecationWarning from quantweave (moved names, the moved module) fails the run: contrib/template
#: is the scaffold's output (tests/core/test_scaffold_template.py), so this is also the check that a
#: generated project's conformance test, run by pytest as its author runs it, warns no quantweave deprecation
DEPRECATIONS_ARE_ERRORS = [
    "-W",
    "error:quantweave:DeprecationWarning",
    "-W",
    "error:the module quantweave:DeprecationWarning",
]


def run(*args: object, cwd: Path | None = None) -> str:
    print("+", " ".join(map(str, args)), flush=True)
    done = subprocess.run([str(a) for a in args], cwd=cwd, text=True, capture_output=True)
    print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", flush=True)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(map(str, args))}")
    return done.stdout


def main(target: str) -> None:
    env = Path(target)
    shutil.rmtree(env, ignore_errors=True)
    python = env / "bin" / "python"
    uv = shutil.which("uv")  # on PATH in tox-uv's envs: torch hard-linked from uv's cache, not copied
    if uv:
        # as tox.ini's [testenv] sets them, for a run by hand too: torch only as the CPU build, from
        # the local wheels; without them uv resolves torch==2.13.0 from PyPI: the CUDA build
        os.environ.setdefault("UV_FIND_LINKS", "/opt/wheels")
        os.environ.setdefault("UV_CONSTRAINT", str(ROOT / ".ci" / "constraints.txt"))
        run(uv, "venv", "-q", "--python", sys.executable, env)
        pip = [uv, "pip", "--quiet"]
        where = ["--python", python]
    else:
        venv.create(env, with_pip=True)
        pip = [python, "-m", "pip", "--quiet", "--disable-pip-version-check"]
        where = []
    run(*pip, "install", *where, "torch==2.13.0")
    run(*pip, "install", *where, ROOT / "core", ROOT / "pytest-quantweave", ROOT / "contrib" / "template")
    listed = run(*pip, "list", *where, "--format=freeze")
    names = {line.split("==")[0].lower() for line in listed.splitlines() if "==" in line}
    ours = {n for n in names if "quantweave" in n}
    if ours != EXPECTED:
        sys.exit(f"the venv holds quantweave distributions {sorted(ours)}, expected exactly {sorted(EXPECTED)}")
    others = sorted(n for n in names if n.startswith("pytest-") and n != "pytest-quantweave")
    if others:
        sys.exit(f"other pytest plugins in the venv: {others}")
    with tempfile.TemporaryDirectory() as tmp:
        tests = Path(tmp) / "tests"
        shutil.copytree(ROOT / "contrib" / "template" / "tests", tests)
        out = run(
            python, "-m", "pytest", "-v", "-p", "no:cacheprovider", *DEPRECATIONS_ARE_ERRORS, tests, cwd=Path(tmp)
        )
    if "quantweave" not in out.split("plugins:", 1)[-1].split("\n", 1)[0]:
        sys.exit("pytest did not list the quantweave plugin (pytest11 entry point) in its header")
    print("fresh venv: contrib/template's conformance test passed through pytest-quantweave", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python pytest-quantweave/tests/fresh_venv.py VENV_DIR")
    main(sys.argv[1])

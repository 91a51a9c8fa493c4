"""Tox env ``publish``, first step: what a third-party publisher does, from wheels.

``python tests/publish/build.py WORKDIR`` (WORKDIR: the env's ``{envtmpdir}``):

1. builds wheels of the core, pytest-quantweave (the conformance kit the generated
   project's tests use), quantweave-x86 and contrib/litert (quantweave-litert) into
   ``WORKDIR/dist`` and installs exactly these wheel files (their other requirements from
   the package index);
2. generates a plugin project with the installed ``quantweave new-plugin acme`` (so the
   templates come from the core *wheel*) into ``WORKDIR/quantweave-acme``;
3. builds its sdist and wheel, unedited, into ``WORKDIR/dist`` and installs the wheel.

The env then lints the generated project and runs the litert conformance and composition
tests and ``tests/publish`` against what is installed (the generated project's own tests run
once, in tests/publish/test_develop_block.py, through its README's Develop block; its
``tox.ini`` is checked with ``tox config`` in tests/publish/test_published.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "acme"


def run(*args: str | Path, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(a) for a in args], check=True, env=env)


def build(source: Path, dist: Path, *targets: str) -> None:
    # no isolation: hatchling comes from the env (tox deps), nothing is downloaded per build
    run(sys.executable, "-m", "build", *targets, "--no-isolation", "--outdir", dist, source)


def install(dist: Path, *stems: str) -> None:
    # exactly these wheel files; their other requirements (pluggy, ...) come from the index
    wheels = []
    for stem in stems:
        (wheel,) = dist.glob(f"{stem}-*.whl")
        wheels.append(wheel)
    # tox-uv's envs have uv on PATH and no pip: the same install, hard-linked from uv's cache
    uv = shutil.which("uv")
    run(
        *([uv, "pip", "install", "--python", sys.executable] if uv else [sys.executable, "-m", "pip", "install"]),
        *wheels,
    )


def main(workdir: str) -> None:
    work = Path(workdir)
    dist, project = work / "dist", work / f"quantweave-{PLUGIN}"
    for path in (dist, project):
        shutil.rmtree(path, ignore_errors=True)
    for source in ("core", "pytest-quantweave", "plugins/x86", "contrib/litert"):
        build(ROOT / source, dist, "--wheel")
    install(dist, "quantweave", "pytest_quantweave", "quantweave_x86", "quantweave_litert")
    script = Path(sys.executable).with_name("quantweave")
    run(script, "new-plugin", PLUGIN, "--dir", project)
    build(project, dist, "--sdist", "--wheel")
    install(dist, f"quantweave_{PLUGIN}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/publish/build.py WORKDIR")
    main(sys.argv[1])

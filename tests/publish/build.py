"""Tox env ``publish``, first step: what a third-party publisher does, from wheels.

``python tests/publish/build.py WORKDIR`` (WORKDIR: the env's ``{envtmpdir}``):

1. builds wheels of the core, quantweave-x86 and contrib/litert (quantweave-litert) into
   ``WORKDIR/dist`` and installs them (no index: exactly these wheels; their other
   requirements are already in the env);
2. generates a plugin project with the installed ``quantweave new-plugin acme`` (so the
   templates come from the core *wheel*) into ``WORKDIR/quantweave-acme``;
3. builds its sdist and wheel, unedited, into ``WORKDIR/dist`` and installs the wheel.

The env then lints the generated project, runs its own tests, the litert conformance and
composition tests and ``tests/publish`` against what is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "acme"


def run(*args: str | Path) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(a) for a in args], check=True)


def build(source: Path, dist: Path, *targets: str) -> None:
    # no isolation: hatchling comes from the env (tox deps), nothing is downloaded per build
    run(sys.executable, "-m", "build", *targets, "--no-isolation", "--outdir", dist, source)


def install(dist: Path, *names: str) -> None:
    run(sys.executable, "-m", "pip", "install", "--no-index", "--find-links", dist, *names)


def main(workdir: str) -> None:
    work = Path(workdir)
    dist, project = work / "dist", work / f"quantweave-{PLUGIN}"
    for path in (dist, project):
        shutil.rmtree(path, ignore_errors=True)
    for source in ("core", "plugins/x86", "contrib/litert"):
        build(ROOT / source, dist, "--wheel")
    install(dist, "quantweave", "quantweave-x86", "quantweave-litert")
    script = Path(sys.executable).with_name("quantweave")
    run(script, "new-plugin", PLUGIN, "--dir", project)
    build(project, dist, "--sdist", "--wheel")
    install(dist, f"quantweave-{PLUGIN}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/publish/build.py WORKDIR")
    main(sys.argv[1])

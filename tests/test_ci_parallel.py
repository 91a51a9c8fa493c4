""".ci/parallel.py reads each env's log (pytest's closing lines added up, tox's set-up figure) and starts
envs longest first by an earlier run's durations (.ci/durations.txt)."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def parallel():
    spec = importlib.util.spec_from_file_location("ci_parallel", ROOT / ".ci" / "parallel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOG = """\
xnnpack: commands_pre[0]> uv pip install --no-deps torchao==0.18.0 executorch==1.5.1
========== 75 passed, 2 skipped, 158 deselected, 113 warnings in 401.20s (0:06:41) ==========
================ 3 passed, 1 error in 2.10s ================
  xnnpack: OK (419.69=setup[17.06]+cmd[1.56,401.07] seconds)
  congratulations :) (420.49 seconds)
"""


def test_the_pytest_runs_of_an_env_are_added_up_and_tox_s_set_up_is_read(tmp_path):
    ci = parallel()
    log = tmp_path / "xnnpack.log"
    log.write_text(LOG)
    assert ci.pytest_counts(log) == {"passed": 78, "skipped": 2, "deselected": 158, "warnings": 113, "errors": 1}
    assert ci.tox_setup(log) == 17.06


def test_a_log_without_tox_s_closing_line_has_no_set_up_figure(tmp_path):
    ci = parallel()
    log = tmp_path / "lint.log"
    log.write_text("lint: commands[0]> ruff check .\n  lint: FAIL code 1 (3.10 seconds)\n")
    assert ci.tox_setup(log) is None
    assert ci.pytest_counts(log) == {}


def test_envs_start_longest_first_by_the_earlier_durations_unknown_envs_first(tmp_path):
    ci = parallel()
    figures = tmp_path / "durations.txt"
    figures.write_text("# a comment\nzoo 300\ncore 100  # trailing comment\n\nfuzz 400\nlint 100\n")
    durations = ci.read_durations(figures)
    assert durations == {"zoo": 300.0, "core": 100.0, "fuzz": 400.0, "lint": 100.0}
    # new has no figure: first; core and lint tie: tox's order kept; gone (in the file, not in tox): ignored
    assert ci.longest_first(["lint", "zoo", "core", "new", "fuzz"], durations) == ["new", "fuzz", "zoo", "lint", "core"]
    assert ci.read_durations(tmp_path / "missing.txt") == {}


def test_a_bad_durations_line_names_the_file_and_line(tmp_path):
    ci = parallel()
    figures = tmp_path / "durations.txt"
    figures.write_text("zoo 300\nfuzz four minutes\n")
    with pytest.raises(SystemExit, match=r"durations\.txt:2: .*'fuzz four minutes'"):
        ci.read_durations(figures)


def test_the_repository_s_durations_name_every_env_of_tox_s_envlist():
    ci = parallel()
    envlist = re.search(r"^envlist = (.*)$", (ROOT / "tox.ini").read_text(), re.M)
    assert envlist is not None
    assert set(ci.read_durations(ROOT / ".ci" / "durations.txt")) == {e.strip() for e in envlist[1].split(",")}


def test_a_run_writes_its_durations_longest_first_readable_as_the_next_order(tmp_path):
    ci = parallel()
    jobs = []
    for env, took in (("core", 120.4), ("zoo", 500.0), ("lint", 6.0)):
        job = ci.Job(env, tmp_path, [])
        job.start, job.end = 1000.0, 1000.0 + took
        jobs.append(job)
    ci.write_durations(tmp_path / "durations.txt", jobs)
    assert ci.read_durations(tmp_path / "durations.txt") == {"zoo": 500.0, "core": 120.0, "lint": 6.0}
    assert ci.longest_first(["lint", "core", "zoo"], ci.read_durations(tmp_path / "durations.txt")) == [
        "zoo",
        "core",
        "lint",
    ]

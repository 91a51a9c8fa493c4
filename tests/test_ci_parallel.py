""".ci/parallel.py reads each env's log: pytest's closing lines added up, tox's set-up figure."""

import importlib.util
from pathlib import Path

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

"""Hypothesis profiles for the fuzz tests, and the end-of-run coverage summary.

``HYPOTHESIS_PROFILE`` selects the budget (see docs/fuzzing.md):

* ``ci`` (tox env ``fuzz``): derandomized, so every CI run tests the same models; a fixed
  number of examples per test (:data:`BUDGETS`), about 2.5-3.5 minutes on 2 shared cores;
* ``dev``: random, many more examples (a longer local run; failures are saved in
  ``.hypothesis/`` and replayed first next time);
* ``default`` (no variable): random, the CI budget.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest

from tests.fuzz import stats

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")

# environments without hypothesis (the default tox env) collect nothing here
HAVE_HYPOTHESIS = importlib.util.find_spec("hypothesis") is not None
collect_ignore_glob = [] if HAVE_HYPOTHESIS else ["test_*.py"]

# examples per test, per profile
BUDGETS: dict[str, dict[str, int]] = {
    # flow was 800: 6-8 minutes on 2 shared cores (about 0.2-0.4 s per example, 1-3 flows
    # each), and examples 400-800 hold a failure not triaged yet (docs/fuzzing.md, "Known gaps")
    "ci": {"flow": 400, "deterministic": 60, "order": 60, "qat": 80, "lowering": 3, "rejected": 45},
    "dev": {"flow": 3000, "deterministic": 400, "order": 400, "qat": 400, "lowering": 30, "rejected": 630},
}
BUDGETS["default"] = BUDGETS["ci"]

# a generated model is a few hundred draws; every example runs export + several flows, so
# the per-example deadline is off (the budget is the number of examples)
_COMMON: dict[str, Any] = {"deadline": None, "print_blob": True}
if HAVE_HYPOTHESIS:
    from hypothesis import HealthCheck, settings

    if PROFILE not in BUDGETS:
        raise pytest.UsageError(f"HYPOTHESIS_PROFILE={PROFILE!r}: expected one of {', '.join(BUDGETS)}")
    # data_too_large: the deepest programs (nested branches) can exceed hypothesis' buffer,
    # and are then discarded, which is harmless; too_slow: one model is a few hundred draws
    # (its layers and their shapes), which hypothesis would flag although drawing it takes
    # milliseconds next to the export and the flows each example runs
    _COMMON["suppress_health_check"] = [HealthCheck.data_too_large, HealthCheck.too_slow]
    settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
    settings.register_profile("dev", **_COMMON)
    settings.register_profile("default", **_COMMON)
    settings.load_profile(PROFILE)


def budget(test: str) -> int:
    return BUDGETS[PROFILE][test]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not stats.RUNS:
        return
    write = terminalreporter.write_line
    terminalreporter.section(f"fuzz coverage (HYPOTHESIS_PROFILE={PROFILE})")
    for line in stats.summary():
        write(line)

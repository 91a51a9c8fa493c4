"""Run tox environments N at a time (default 2, one per core) and say what happens as it happens.

    python .ci/parallel.py [-p N] [-e ENV,ENV...] [--logs DIR]

Every env of tox's default envlist (``tox -l``) is run as its own ``tox -e ENV`` process, its output
written to ``DIR/ENV.log`` (default ``.tox/ci-logs``). Envs start longest first (tox.ini's envlist
order), so the short ones fill in beside the long ones. Printed, a line each: when an env starts, when
it ends (duration, OK / FAILED and its pytest summary), a heartbeat every minute naming what runs; at
the end a table (env, start, end, duration, result), the wall time with the load average, each failed
env's last lines, and the tests of every env added up. Exit status: 0 when every env passed.
Standard library only: it runs with the interpreter tox is installed in.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: pytest's closing line, e.g. "==== 1229 passed, 3 skipped, 2 xfailed in 401.2s ===="
SUMMARY = re.compile(r"^=+ (?P<body>(?:\d+ \w+(?:, )?)+) in [\d.]+s")
COUNT = re.compile(r"(\d+) (\w+)")


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def duration(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "load average unknown"


def say(line: str) -> None:
    print(f"[{clock(time.time())}] {line}", flush=True)


def pytest_counts(log: Path) -> dict[str, int]:
    """Every pytest closing line in one env's log (an env may run pytest several times), added up."""
    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = SUMMARY.match(line.strip())
        if match:
            for number, what in COUNT.findall(match["body"]):
                key = {"error": "errors", "warning": "warnings"}.get(what, what)
                counts[key] = counts.get(key, 0) + int(number)
    return counts


class Job:
    def __init__(self, env: str, logs: Path, tox: list[str]) -> None:
        self.env, self.log, self.tox = env, logs / f"{env}.log", tox
        self.start = self.end = 0.0
        self.code: int | None = None

    def run(self) -> None:
        self.start = time.time()
        with self.log.open("w") as out:
            self.code = subprocess.call([*self.tox, "-e", self.env], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        self.end = time.time()

    @property
    def result(self) -> str:
        return "OK" if self.code == 0 else f"FAILED (exit {self.code})"

    def counts(self) -> str:
        counts = pytest_counts(self.log)
        return ", ".join(f"{n} {what}" for what, n in counts.items()) or "no pytest run"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--parallel", type=int, default=2, help="envs at a time (default 2)")
    parser.add_argument("-e", "--envs", help="comma-separated envs (default: tox's envlist)")
    parser.add_argument("--logs", type=Path, default=ROOT / ".tox" / "ci-logs")
    args = parser.parse_args(argv)
    tox = [sys.executable, "-m", "tox"]
    if args.envs:
        envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    else:
        listed = subprocess.run([*tox, "-l"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        envs = [line.strip() for line in listed.splitlines() if line.strip()]
    args.logs.mkdir(parents=True, exist_ok=True)
    jobs = [Job(env, args.logs, tox) for env in envs]
    began = time.time()
    say(f"{len(jobs)} tox envs, {args.parallel} at a time, logs in {args.logs}: {', '.join(envs)} ({load()})")

    waiting = list(jobs)
    running: dict[threading.Thread, Job] = {}
    last_beat = time.time()
    while waiting or running:
        while waiting and len(running) < args.parallel:
            job = waiting.pop(0)
            thread = threading.Thread(target=job.run, daemon=True)
            running[thread] = job
            thread.start()
            say(f"start  {job.env:<12} ({len(waiting)} waiting)")
        time.sleep(1)
        for thread in [t for t in running if not t.is_alive()]:
            job = running.pop(thread)
            say(f"end    {job.env:<12} {duration(job.end - job.start):>7}  {job.result}  [{job.counts()}]")
        if running and time.time() - last_beat >= 60:
            last_beat = time.time()
            now = time.time()
            busy = ", ".join(f"{j.env} {duration(now - j.start)}" for j in running.values())
            say(f"running {busy}; {len(jobs) - len(waiting) - len(running)} of {len(jobs)} done ({load()})")

    wall = time.time() - began
    print(f"\n{'env':<12} {'start':>8} {'end':>8} {'duration':>9}  result")
    for job in jobs:
        print(
            f"{job.env:<12} {clock(job.start):>8} {clock(job.end):>8} {duration(job.end - job.start):>9}  {job.result}"
        )
    failed = [job for job in jobs if job.code != 0]
    print(f"wall time {duration(wall)} for {len(jobs)} envs, {args.parallel} at a time ({load()} at the end)")
    for job in failed:
        tail = job.log.read_text(errors="replace").splitlines()[-60:]
        print(f"\n---- {job.env} failed; last lines of {job.log}:\n" + "\n".join(tail))
    total: dict[str, int] = {}
    for job in jobs:
        for what, n in pytest_counts(job.log).items():
            total[what] = total.get(what, 0) + n
    extra = "".join(f", {total[k]} {k}" for k in ("skipped", "xfailed", "errors") if total.get(k))
    print(f"\ntox envs: {len(jobs) - len(failed)} passed, {len(failed)} failed")
    print(f"tests: {total.get('passed', 0)} passed, {total.get('failed', 0)} failed{extra}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

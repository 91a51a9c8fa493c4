"""Run tox environments N at a time (default 2, one per core) and say what happens as it happens.

    python .ci/parallel.py [-p N] [-e ENV,ENV...] [--logs DIR] [--durations FILE]

Every env of tox's default envlist (``tox -l``) is run as its own ``tox -e ENV`` process, its output
written to ``DIR/ENV.log`` (default ``.tox/ci-logs``). Envs start longest first, so the short ones fill
in beside the long ones: longest by the durations of an earlier run in ``.ci/durations.txt`` (``ENV
SECONDS`` a line; ``--durations FILE`` names another), an env without a figure first of all (it may be
long), ties and unknown envs in tox.ini's envlist order. Each run writes its own ``DIR/durations.txt``:
copy it over ``.ci/durations.txt`` (from a quiet machine) when envs have grown or shrunk.
Printed, a line each: when an env starts, when it ends (duration, OK / FAILED and its pytest summary), a
heartbeat every minute naming what runs; at the end a table (env, start, end, duration, the env's set-up as
tox reports it, the CPU time of the env's processes and that CPU time over the duration, result), the wall
time with the load average, how busy the cores were (every env's CPU time over wall time x cores: well under
100 % means slots sat idle, e.g. in set-up, and a third slot could help; near 100 % means it cannot), each
failed env's last lines, and the tests of every env added up. Exit status: 0 when every env passed.
Standard library only: it runs with the interpreter tox is installed in (POSIX: os.wait4).
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
#: each env's duration in an earlier CI run, "ENV SECONDS" a line: the order envs start in
DURATIONS = ROOT / ".ci" / "durations.txt"
#: pytest's closing line, e.g. "==== 1229 passed, 3 skipped, 2 xfailed in 401.2s ===="
SUMMARY = re.compile(r"^=+ (?P<body>(?:\d+ \w+(?:, )?)+) in [\d.]+s")
COUNT = re.compile(r"(\d+) (\w+)")
#: tox's closing line of an env, e.g. "  core: OK (56.76=setup[12.92]+cmd[43.84] seconds)"
TOX_SETUP = re.compile(r"^\s*\S+: .*\(([\d.]+)=setup\[([\d.]+)\]\+cmd\[[\d.,]*\] seconds\)")


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


def tox_setup(log: Path) -> float | None:
    """The set-up time (env made and filled; commands_pre count as commands) tox reports for the env."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        match = TOX_SETUP.match(line)
        if match:
            return float(match[2])
    return None


def read_durations(path: Path) -> dict[str, float]:
    """``ENV SECONDS`` a line (``#`` starts a comment); no file, no figures."""
    if not path.is_file():
        return {}
    found: dict[str, float] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            found[parts[0]] = float(parts[1])
        except ValueError:
            raise SystemExit(f"{path}:{number}: expected 'ENV SECONDS', got {line!r}") from None
    return found


def longest_first(envs: list[str], durations: dict[str, float]) -> list[str]:
    """Envs without a figure first (in the given order: they may be long), then the others by their
    figure, longest first (ties in the given order): with N slots, the short envs fill in last."""
    position = {env: i for i, env in enumerate(envs)}
    return sorted(envs, key=lambda env: (env in durations, -durations.get(env, 0.0), position[env]))


def write_durations(path: Path, jobs: list[Job]) -> None:
    lines = [f"{job.env} {job.end - job.start:.0f}" for job in sorted(jobs, key=lambda j: j.start - j.end)]
    path.write_text(
        "# each env's duration in seconds (.ci/parallel.py; the order envs start in)\n" + "\n".join(lines) + "\n"
    )


class Job:
    def __init__(self, env: str, logs: Path, tox: list[str]) -> None:
        self.env, self.log, self.tox = env, logs / f"{env}.log", tox
        self.start = self.end = 0.0
        self.code: int | None = None
        self.cpu = 0.0  # user + system seconds of tox and every process it waited for

    def run(self) -> None:
        self.start = time.time()
        with self.log.open("w") as out:
            proc = subprocess.Popen([*self.tox, "-e", self.env], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = self.code = os.waitstatus_to_exitcode(status)
        self.end = time.time()
        self.cpu = usage.ru_utime + usage.ru_stime

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
    parser.add_argument(
        "--durations",
        type=Path,
        default=DURATIONS,
        help="earlier durations, 'ENV SECONDS' a line (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    tox = [sys.executable, "-m", "tox"]
    if args.envs:
        envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    else:
        listed = subprocess.run([*tox, "-l"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        envs = [line.strip() for line in listed.splitlines() if line.strip()]
    envs = longest_first(envs, read_durations(args.durations))
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
    write_durations(args.logs / "durations.txt", jobs)
    print(f"\n{'env':<12} {'start':>8} {'end':>8} {'duration':>9} {'set-up':>7} {'CPU':>8} {'CPU/dur':>7}  result")
    for job in jobs:
        took, setup = job.end - job.start, tox_setup(job.log)
        print(
            f"{job.env:<12} {clock(job.start):>8} {clock(job.end):>8} {duration(took):>9} "
            f"{'?' if setup is None else f'{setup:.0f}s':>7} {duration(job.cpu):>8} {job.cpu / max(took, 1e-9):>7.0%}"
            f"  {job.result}"
        )
    failed = [job for job in jobs if job.code != 0]
    print(f"wall time {duration(wall)} for {len(jobs)} envs, {args.parallel} at a time ({load()} at the end)")
    cores = os.cpu_count() or 1
    cpu = sum(job.cpu for job in jobs)
    print(
        f"CPU time of the envs {duration(cpu)}, {cpu / max(wall * cores, 1e-9):.0%} of wall time x {cores} cores; "
        f"set-up (tox's figures) {duration(sum(tox_setup(job.log) or 0 for job in jobs))} of env time "
        f"{duration(sum(job.end - job.start for job in jobs))}"
    )
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

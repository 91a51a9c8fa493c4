"""Model Explorer on the outlier model (examples/view_outlier.py), in headless Chromium:
docs/view.md's screenshot, and the browser half of tests/view (which drive the page with
this module's code).

    python examples/view_screenshot.py [OUT.png]   # default docs/images/view_model_explorer.png

Starts ``quantweave view examples/view_outlier.py:build --quantizer x86`` on a free local
port, loads its page in headless Chromium (all layers expanded, the ``op SQNR (dB)``
overlay shown, as on opening) and saves a screenshot. Needs quantweave[view],
quantweave-x86 and a ``chromium`` binary (Debian: ``apt-get install chromium``); only the
standard library drives it (the DevTools protocol over a pipe). Nothing leaves the machine:
the browser resolves no host name but the local server's (the page's Google fonts fail at
once and local fonts are used).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: what the page shows, read from its DOM: the graph's node count, the node-data providers,
#: and the "Node data" table (per node: index, label, and each provider's value and colour)
PAGE_STATE = """(() => {
  const text = (e) => (e ? e.textContent.trim() : null);
  const table = document.querySelector('table.results');
  const rows = table ? Array.from(table.rows) : [];
  return JSON.stringify({
    nodes: ((document.body ? document.body.innerText : '').match(/(\\d+) nodes/) || [])[1] || null,
    headers: rows.length ? Array.from(rows[0].querySelectorAll('.stat-label')).map(text) : [],
    rows: rows.slice(1).map(r => Array.from(r.cells).map(c => [text(c), c.style.backgroundColor || ''])),
    canvas: (() => { const c = document.querySelector('canvas.main');
                     if (!c) return null; const b = c.getBoundingClientRect();
                     return {x: b.x, y: b.y, width: b.width, height: b.height}; })(),
  });
})()"""
#: ``python -c WIRE IN OUT BROWSER ARGS...``: the DevTools pipe's ends IN and OUT onto fds 3 (commands
#: to the browser) and 4 (its replies), then exec the browser
WIRE = (
    "import fcntl, os, sys\n"
    "ends = [fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:3]]\n"
    "os.dup2(ends[0], 3)\n"
    "os.dup2(ends[1], 4)\n"
    "for fd in {*ends, *map(int, sys.argv[1:3])} - {3, 4}: os.close(fd)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)
EXPAND_ALL = (
    'Array.from(document.querySelectorAll("mat-icon")).find(e => e.textContent.trim() === "unfold_more_double").click()'
)


def find_browser() -> str | None:
    """A Chromium-family browser on PATH, or None."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    JSON messages ended by NUL on file descriptors 3 and 4), one page, no network but localhost."""

    def __init__(self, binary: str, size: tuple[int, int] = (1600, 1000)) -> None:
        to_browser, self._writer = os.pipe()
        self._reader, from_browser = os.pipe()
        self._profile = tempfile.mkdtemp(prefix="quantweave-chromium-")
        self.process = subprocess.Popen(
            [
                sys.executable,  # a trampoline puts the pipes on fds 3 and 4 (no preexec_fn: this may run in threads)
                "-I",
                "-c",
                WIRE,
                str(to_browser),
                str(from_browser),
                binary,
                "--headless=new",
                "--no-sandbox",
                "--enable-unsafe-swiftshader",  # WebGL (the graph) on the CPU
                f"--window-size={size[0]},{size[1]}",
                "--remote-debugging-pipe",
                f"--user-data-dir={self._profile}",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                # no host name resolves but the local server's: nothing leaves the machine, nothing waits
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
                "about:blank",
            ],
            pass_fds=(to_browser, from_browser),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        target = self._call("Target.createTarget", None, url="about:blank")["targetId"]
        self._session = self._call("Target.attachToTarget", None, targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Network.enable")

    def _call(self, method: str, session: str | None, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._writer, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._reader], [], [], left)[0]:
                    raise TimeoutError(f"chromium did not answer {method} within {timeout} s")
                chunk = os.read(self._reader, 1 << 20)
                if not chunk:
                    raise EOFError(f"chromium exited during {method} (status {self.process.poll()})")
                self._buffer += chunk
            line, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(line)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"chromium: {method} failed: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        """A DevTools command on the page; its result."""
        return self._call(method, self._session, timeout, **params)

    def evaluate(self, expression: str) -> Any:
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"chromium: {expression[:60]!r}... raised {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def screenshot(self, clip: dict[str, float] | None = None) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        return base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])

    def requests(self) -> dict[str, str]:
        """Every URL the page requested -> ``ok`` (answered) or ``failed: <error>``."""
        urls, status = {}, {}
        for event in self.events:
            params = event.get("params", {})
            if event.get("method") == "Network.requestWillBeSent":
                urls[params["requestId"]] = params["request"]["url"]
            elif event.get("method") == "Network.responseReceived":
                status[params["requestId"]] = "ok"
            elif event.get("method") == "Network.loadingFailed":
                status[params["requestId"]] = f"failed: {params.get('errorText')}"
        return {url: status.get(rid, "pending") for rid, url in urls.items()}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._writer)  # the browser exits when its pipe closes
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        os.close(self._reader)
        shutil.rmtree(self._profile, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(
    model: str = "examples/view_outlier.py:build", quantizer: str = "x86", cwd: Path = ROOT, timeout: float = 180.0
) -> Iterator[str]:
    """``quantweave view MODEL --quantizer QUANTIZER`` run in ``cwd`` on a free local port, in a
    subprocess; yields the page's URL (with its overlays) once the server answers, stops it on exit."""
    port = free_port()
    command = [sys.executable, "-m", "quantweave", "view", model, "--quantizer", quantizer]
    process = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        # unbuffered: the URL line must reach us while the server runs (a pipe is block-buffered; tox does not
        # pass PYTHONUNBUFFERED on)
        env={**os.environ, "BROWSER": "false", "no_proxy": "*", "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout
        pattern = re.compile(rf"http://127\.0\.0\.1:{port}/\?data=\S+")
        while not any(pattern.search(line) for line in list(lines)) or not _healthy(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"quantweave view did not start (port {port}):\n{''.join(lines)}")
            time.sleep(0.3)
        yield next(m.group(0) for line in list(lines) if (m := pattern.search(line)))
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/check_health", timeout=5) as response:
            return response.read() == b"model_explorer_ok"
    except OSError:
        return False


def page_state(browser: Chromium) -> dict[str, Any]:
    return json.loads(browser.evaluate(PAGE_STATE))


def wait_for_graph(browser: Chromium, url: str, overlays: list[str], timeout: float = 120.0) -> dict[str, Any]:
    """Load ``url`` and wait until the graph is laid out, the Node data table has a column
    for each of ``overlays`` (display names) and those that hold numbers are filled; returns
    :data:`PAGE_STATE`."""
    browser.call("Page.navigate", url=url)
    numeric = [i for i, name in enumerate(overlays) if "SQNR" in name or "error" in name]
    deadline = time.monotonic() + timeout
    while True:
        state = page_state(browser)
        if state["canvas"] and sorted(state["headers"]) == sorted(overlays) and state["rows"]:
            columns = [state["headers"].index(overlays[i]) for i in numeric]
            if all(any(row[2 + c][0] != "-" for row in state["rows"]) for c in columns):
                return state
        if time.monotonic() > deadline:
            raise TimeoutError(f"Model Explorer did not draw the graph with the overlays {overlays}: {state}")
        time.sleep(0.5)


def expand_all(browser: Chromium) -> None:
    browser.evaluate(EXPAND_ALL)
    browser.evaluate("document.activeElement && document.activeElement.blur()")  # no tooltip in the picture


def main(out: Path) -> None:
    from quantweave.view import OVERLAYS

    binary = find_browser()
    if binary is None:
        raise SystemExit(f"no browser found (tried {', '.join(BROWSERS)}); Debian: apt-get install chromium")
    with serving() as url:
        browser = Chromium(binary)
        try:
            wait_for_graph(browser, url, list(OVERLAYS.values()))
            expand_all(browser)
            time.sleep(3)  # the layers open, animated
            out.write_bytes(browser.screenshot())
        finally:
            browser.close()
    print("wrote", out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images" / "view_model_explorer.png")

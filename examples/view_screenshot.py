"""Screenshot of a running ``quantweave view`` server in headless Chromium (docs/view.md's
picture), driven over the DevTools protocol: load the page, expand all layers, capture.

    quantweave view examples/view_outlier.py:build --quantizer x86 --port 8731 &   # prints the URL
    python examples/view_screenshot.py URL docs/images/view_model_explorer.png

Needs a ``chromium`` binary (Debian: ``apt-get install chromium``) and ``websocket-client``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.request

import websocket  # websocket-client

EXPAND_ALL = (
    'Array.from(document.querySelectorAll("mat-icon")).find(e => e.textContent.trim() === "unfold_more_double").click()'
)


def screenshot(url: str, out: str, port: int = 9333, settle: float = 15.0) -> None:
    chrome = subprocess.Popen(
        [
            "chromium",
            "--headless=new",
            "--no-sandbox",
            "--enable-unsafe-swiftshader",
            "--window-size=1600,1000",
            f"--remote-debugging-port={port}",
            "--remote-allow-origins=*",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(60):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json") as response:
                    tabs = json.loads(response.read())
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError("chromium's DevTools endpoint did not come up")
        page = next(t for t in tabs if t["type"] == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        counter = 0

        def call(method: str, **params: object) -> dict:
            nonlocal counter
            counter += 1
            ws.send(json.dumps({"id": counter, "method": method, "params": params}))
            while True:
                message = json.loads(ws.recv())
                if message.get("id") == counter:
                    return message.get("result", message)

        call("Page.enable")
        call("Page.navigate", url=url)
        time.sleep(settle)  # the app converts and lays out the graph, then loads the node data
        call("Runtime.evaluate", expression=EXPAND_ALL)
        time.sleep(5)
        data = call("Page.captureScreenshot", format="png")["data"]
        with open(out, "wb") as f:
            f.write(base64.b64decode(data))
        print("wrote", out)
    finally:
        chrome.terminate()
        chrome.wait(10)


if __name__ == "__main__":
    screenshot(sys.argv[1], sys.argv[2])

"""Run documentation snippets (tests/test_snippets.py): reads a JSON list of blocks
``{"id": "README.md:39", "code": ..., "continues": bool}`` on standard input, runs each in
a fresh namespace (or, with ``continues``, in the previous block's), from the current
directory, and prints one JSON line: ``{id: {"seconds": ...} (+ "error": traceback)}``. A block after a
failed one it continues is reported as not run."""

import json
import sys
import time
import traceback
import warnings
from pathlib import Path


def main() -> None:
    if sys.path and sys.path[0] == str(Path(__file__).resolve().parent):
        del sys.path[0]  # the tests folder (tests/onnxruntime would shadow the onnxruntime package)
    sys.path.insert(0, "")  # the current directory, as `python -c` has it
    blocks = json.loads(sys.stdin.read())
    results: dict[str, dict[str, str]] = {}
    namespace: dict[str, object] = {}
    failed = False
    filters = list(warnings.filters)
    for block in blocks:
        if not block["continues"]:  # a fresh start: a block's warning filters do not reach the next
            namespace, failed = {"__name__": "__main__"}, False
            warnings.filters[:] = filters
        elif failed:
            results[block["id"]] = {"error": "not run: the block it continues failed"}
            continue
        start = time.perf_counter()
        try:
            exec(compile(block["code"], block["id"], "exec"), namespace)
        except BaseException:  # every failure is reported, SystemExit included
            failed = True
            results[block["id"]] = {"error": traceback.format_exc()}
        else:
            results[block["id"]] = {}
        results[block["id"]]["seconds"] = f"{time.perf_counter() - start:.1f}"
    sys.stdout.flush()
    print("\n" + json.dumps(results))


if __name__ == "__main__":
    main()

"""Plugin-system overhead: `import quantweave` and the first `quantization_capabilities()`.

Each sample runs in a fresh interpreter (imports are cached per process). torch is imported
first and timed separately, so the figures are quantweave's own overhead on top of torch.
Run with the plugins you want measured installed (all first-party plugins for the record).

    python benchmarks/bench_plugins.py [--runs 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROBE = r"""
import json, time
t0 = time.perf_counter()
import torch  # noqa: F401
t1 = time.perf_counter()
import quantweave
t2 = time.perf_counter()
caps = quantweave.quantization_capabilities()
t3 = time.perf_counter()
plugins = quantweave.plugins()
print(json.dumps({
    "torch_import_s": t1 - t0,
    "quantweave_import_s": t2 - t1,
    "first_capabilities_s": t3 - t2,
    "plugins": [(p.name, p.status) for p in plugins],
    "capabilities": len(caps),
}))
"""


def sample() -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    samples = [sample() for _ in range(args.runs)]
    keys = ("torch_import_s", "quantweave_import_s", "first_capabilities_s")
    medians = {k: statistics.median(s[k] for s in samples) for k in keys}
    own = medians["quantweave_import_s"] + medians["first_capabilities_s"]
    print(
        f"runs: {args.runs} fresh interpreters; plugins: {samples[0]['plugins']}; "
        f"capabilities: {samples[0]['capabilities']}"
    )
    print(f"{'import torch (not ours)':<34} {medians['torch_import_s'] * 1e3:8.1f} ms")
    print(f"{'import quantweave':<34} {medians['quantweave_import_s'] * 1e3:8.1f} ms")
    print(f"{'first quantization_capabilities()':<34} {medians['first_capabilities_s'] * 1e3:8.1f} ms")
    print(
        f"{'quantweave overhead (sum)':<34} {own * 1e3:8.1f} ms   target < 50 ms: {'met' if own < 0.05 else 'NOT met'}"
    )
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"medians": medians, "own_overhead_s": own, "samples": samples}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The closing-note table of issue #21: vendor x model -> direct result (quantweave's flow),
q/dq count against torchao's, max abs diff, composes with quantweave-xnnpack (vendor first),
number of derived capabilities and probing time (seconds, probes' export excluded).

Run in the tox ``hosting`` env: ``python -m tests.hosting.table`` (prints Markdown). Times
are of the machine it runs on: re-measure on a quiet one before quoting them.
"""

from __future__ import annotations

import logging
import os
import time
import warnings

import torch

import quantweave as qw
from quantweave._modules.derive import exported_probe, probe_stats
from quantweave.capabilities import derive_capabilities
from quantweave.registry import PluginManager

from .parity import MODELS, exported, parity, qdq_count, run_quantweave


def main() -> None:
    import quantweave_vendors.plugin as vendors_plugin
    import quantweave_xnnpack.plugin as xnnpack_plugin
    from quantweave_vendors._vendors import BY_NAME

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    pm = PluginManager(entry_points=[], strict=False)
    pm.register("vendors", vendors_plugin)
    pm.register("xnnpack", xnnpack_plugin)
    start = time.perf_counter()
    exported_probe("linear")
    rows = []
    names = [key.split(":", 1)[1] for key in pm.quantizer_infos() if key.startswith("vendors:")]
    for name in names:
        quantizer = pm.get_quantizer(name)
        caps = derive_capabilities(quantizer)
        stats = probe_stats(quantizer)
        probing = f"{stats.seconds:.2f}" if stats is not None else "?"
        for model in MODELS:
            try:
                result = parity(name, BY_NAME[name].build, pm.get_quantizer(name), model)
                direct = "ok"
                counts = f"{result.quantweave_qdq} / {result.torchao_qdq}"
                diff = f"{result.max_diff:g}"
            except Exception as exc:  # recorded, not hidden
                direct, counts, diff = f"{type(exc).__name__}", "-", "-"
            try:
                composed = qw.ComposableQuantizer([pm.get_quantizer(name), pm.get_quantizer("xnnpack")])
                converted = run_quantweave(composed, model)
                _, _, test = exported(model)
                composes = f"yes ({qdq_count(converted)} q/dq)" if torch.isfinite(converted(*test)).all() else "nan"
            except Exception as exc:
                composes = f"no: {type(exc).__name__}"
            rows.append((name, model, direct, counts, diff, composes, str(len(caps)), probing))
    header = ("vendor", "model", "direct", "q/dq quantweave / torchao", "max diff", "composes", "derived", "probing s")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\ntotal {time.perf_counter() - start:.0f} s, load average {load:.1f}")


if __name__ == "__main__":
    main()

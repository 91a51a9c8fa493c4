"""Print the digits accuracy table of docs/benchmarks.md: float, PTQ and QAT accuracy per
model and first-party plugin, and the outlier-channel fallback, for the given seeds.

    python -m tests.accuracy.results [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import time
import warnings

import quantweave as qw
from quantweave.testing import digits

from .cases import MODEL_NAMES, PLUGINS, available, quantizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    data = digits.load_digits_data()
    plugins = [p for p in PLUGINS if available(p)]
    header = ["seed", "model", "float"] + [
        f"{p} {mode}" for p in plugins for mode in ("PTQ", "QAT") if mode == "PTQ" or PLUGINS[p][2]
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    start = time.perf_counter()
    for seed in args.seeds:
        for name in MODEL_NAMES:
            model = digits.trained_model(name, seed=seed, data=data)
            row = [str(seed), name, f"{digits.accuracy(model, data.test_x, data.test_y):.2f}"]
            for plugin in plugins:
                ptq = digits.quantize_ptq(model, quantizer(plugin), data)
                row.append(f"{digits.accuracy(ptq, data.test_x, data.test_y):.2f}")
                if PLUGINS[plugin][2]:
                    qat = digits.quantize_qat(model, quantizer(plugin, qat=True), data, seed=seed)
                    row.append(f"{digits.accuracy(qat, data.test_x, data.test_y, batch_size=digits.QAT_BATCH):.2f}")
            print("| " + " | ".join(row) + " |", flush=True)
        cnn = digits.trained_model("cnn", seed=seed, data=data)
        exported = digits.export_digits(digits.make_outlier_channel(cnn, channel=3, factor=1000.0))
        for plugin in plugins:
            result = qw.fallback(
                exported,
                quantizer(plugin),
                digits.batches(data.train_x, 256),
                lambda m: digits.accuracy(m, data.test_x, data.test_y),
                max_drop=1.0,
            )
            print(f"outlier seed {seed} {plugin}: {result.summary()}", flush=True)
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

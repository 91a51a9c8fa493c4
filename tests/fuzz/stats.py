"""What the fuzz run covered: models generated, flows run, op kinds and aten ops seen."""

from __future__ import annotations

from collections import Counter

from torch.fx import GraphModule

#: test name -> generated models it ran
RUNS: Counter[str] = Counter()
#: quantizer config label -> flows run
FLOWS: Counter[str] = Counter()
#: program op kinds ("conv2d[functional]")
KINDS: Counter[str] = Counter()
#: aten ops in the exported graphs
ATEN: Counter[str] = Counter()
#: documented errors raised (class name)
ERRORS: Counter[str] = Counter()
#: float nodes skipped by a known gap (gap name)
GAPS: Counter[str] = Counter()
#: broken calibration batches (issue #20): "mutation: raised" / "mutation: accepted"
REJECTED: Counter[str] = Counter()


def record_model(test: str, kinds: set[str], exported: GraphModule) -> None:
    RUNS[test] += 1
    KINDS.update(kinds)
    ATEN.update({str(n.target) for n in exported.graph.nodes if n.op == "call_function"})


def summary() -> list[str]:
    lines = [f"generated models: {sum(RUNS.values())} ({', '.join(f'{k}: {v}' for k, v in sorted(RUNS.items()))})"]
    lines.append(f"flows (export -> prepare -> calibrate -> convert -> run): {sum(FLOWS.values())}")
    for label, count in sorted(FLOWS.items()):
        lines.append(f"  {count:5d}  {label}")
    forms = sorted(KINDS)
    ops = sorted({k.split("[")[0] for k in forms})
    lines.append(f"program ops covered: {len(ops)} ({', '.join(ops)})")
    lines.append(f"op forms covered: {len(forms)}")
    aten = sorted(a.removeprefix("aten.") for a in ATEN)
    lines.append(f"aten ops in the exported graphs: {len(aten)} ({', '.join(aten)})")
    if ERRORS:
        lines.append("documented errors raised: " + ", ".join(f"{k}: {v}" for k, v in sorted(ERRORS.items())))
    if GAPS:
        lines.append("float nodes excused by a known gap: " + ", ".join(f"{k}: {v}" for k, v in sorted(GAPS.items())))
    if REJECTED:
        lines.append("broken calibration batches: " + ", ".join(f"{k}: {v}" for k, v in sorted(REJECTED.items())))
    return lines

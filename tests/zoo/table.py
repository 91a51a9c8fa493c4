"""docs/zoo.md: the zoo's table (model x plugin: coverage, SQNR, the peer's, loads).

    python -m tests.zoo.table            # measure everything, write docs/zoo.md
    python -m tests.zoo.table --check    # measure, exit 1 if docs/zoo.md disagrees
    python -m tests.zoo.table --out PATH # write elsewhere
    python -m tests.zoo.table --from LOG [LOG ...]  # render what QUANTWEAVE_ZOO_LOG files recorded
        [--allow-missing]                           # (cases they lack: "not measured")

(with the plugins and ExecuTorch / torchao / transformers installed as ``tox -e zoo`` installs
them; ``OMP_NUM_THREADS=1``). The tox env ``zoo`` measures once, in its tests
(tests/zoo/test_zoo.py), and checks docs/zoo.md against that run: the coverage counts and
what loads must be equal, SQNRs within ``SQNR_TOLERANCE`` dB (they move a little with the
CPU's int8 kernels). The x86 rows' recipe depends on the CPU (activations in [0, 127] without VNNI /
AMX, ``quantweave_x86.cpu_needs_reduce_range``): the file says which it was measured with, and
its x86 SQNRs are compared only on a CPU that takes the same recipe (the peer comparisons of
tests/zoo/test_zoo.py hold them on every CPU).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from .measure import CASES, Measurement, from_log, measure

DOC = Path(__file__).resolve().parents[2] / "docs" / "zoo.md"
COMMAND = "OMP_NUM_THREADS=1 python -m tests.zoo.table"
SQNR_TOLERANCE = 1.0
PEERS = {
    "x86": "torchao 0.18 X86InductorQuantizer",
    "xnnpack": "ExecuTorch 1.5.1 XNNPACKQuantizer",
    "llm": "ExecuTorch 1.5.1 embedding,xnnpack_dynamic",
}
HEADER = (
    "| model | plugin | coverage | SQNR (dB) | runtime SQNR (dB) | loads | peer coverage | peer SQNR (dB) | notes |",
    "|---|---|---|---|---|---|---|---|---|",
)
INTRO = f"""# The zoo: real architectures through every plugin

Generated, do not edit: `{COMMAND}` (from the repository root, with the `zoo` tox env's
packages: `tox -e zoo` runs the same measurements as tests and checks this file against them).

Architectures from `transformers` configs with random initialisation, small sizes that keep
each architecture's kinds of blocks and weighted ops (tests/zoo/models.py: 1 layer for the
transformers, 1 block per stage for ResNet, ConvNeXt, RegNet and Swin, 6 of MobileNetV2's 16
inverted-residual blocks, EfficientNet-B0's first 3 stages; 32x32 images, 16 tokens; batch-norm
statistics from train-mode passes). Each float model is exported once and shared by every
plugin's flow (ours must leave it unchanged; the peer gets a copy). Per model and plugin,
measured in one run:

- **coverage**: weighted ops (conv, linear, addmm / mm / matmul with a constant operand,
  embedding) whose weight is quantized in the converted graph / all of them;
- **SQNR**: of the converted model (reference quantize / dequantize) against the float model,
  on the same input; **runtime SQNR**: of our program on its runtime (x86: `quantweave_x86.lower`,
  inductor; xnnpack and llm: the ExecuTorch 1.5.1 runtime, XNNPACK delegate);
- **loads**: our program lowered, loaded and ran;
- **peer**: the same model, calibration and SQNR measure through the peer ({PEERS["x86"]} for
  x86, {PEERS["xnnpack"]} (per-channel) for xnnpack, {PEERS["llm"]} for
  `ExecuTorchQuantizer("llm")`), prepared and converted by torchao 0.18; "fails" when it raises.

Held in tests/zoo/test_zoo.py: our coverage >= the peer's; our SQNR not below the peer's by
more than 0.3 dB where the coverage is equal; every program loads and runs.
"""
#: the line of docs/zoo.md that names the x86 rows' recipe (it depends on the CPU)
X86_RECIPE = "x86 rows (ours and the peer's) quantize activations in "
_RECIPES = {
    True: "[0, 127] (`reduce_range`: the CPU that measured them has no VNNI / AMX int8 instructions).",
    False: "[0, 255] (the CPU that measured them has VNNI or AMX int8 instructions).",
}


def x86_recipe() -> str:
    """This CPU's line of ``X86_RECIPE``."""
    import quantweave_x86 as q86

    return X86_RECIPE + _RECIPES[q86.cpu_needs_reduce_range()]


def recipe_of(text: str) -> str | None:
    """The ``X86_RECIPE`` line of a rendered table, None when it has none."""
    return next((line for line in text.splitlines() if line.startswith(X86_RECIPE)), None)


def _db(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def row(m: Measurement) -> str:
    if m.error == "not measured":
        return f"| {m.model} | {m.plugin} | - | - | - | - | - | - | not measured in this run |"
    notes = []
    if m.error:
        notes.append(f"ours: {m.error}")
    if m.peer_error:
        notes.append(f"peer fails: {m.peer_error}")
    cells = (
        m.model,
        m.plugin,
        m.coverage if m.weighted else "-",
        _db(m.sqnr),
        _db(m.runtime_sqnr),
        "yes" if m.loads else "no",
        m.peer_coverage or "fails",
        _db(m.peer_sqnr),
        "; ".join(notes).replace("|", "/"),
    )
    return "| " + " | ".join(cells) + " |"


def render(measurements: Iterable[Measurement]) -> str:
    return "\n".join((INTRO, x86_recipe(), "", *HEADER, *(row(m) for m in measurements))) + "\n"


def _cells(text: str) -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith(HEADER[0][:8]):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[(cells[0], cells[1])] = cells
    return rows


def differences(expected: str, actual: str) -> list[str]:
    """How the table in ``actual`` (a docs/zoo.md) differs from ``expected`` (a fresh render):
    the x86 recipe line, rows, coverage and loads exactly, SQNRs within SQNR_TOLERANCE dB, the
    x86 rows' SQNRs only where both were measured with the same recipe (``recipe_of``)."""
    want, got = _cells(expected), _cells(actual)
    same_x86_recipe = recipe_of(expected) == recipe_of(actual)
    problems = [] if recipe_of(actual) else [f"the file has no line that starts {X86_RECIPE!r}"]
    problems += [f"{k}: missing from the file" for k in want.keys() - got.keys()]
    problems += [f"{k}: in the file, not measured" for k in got.keys() - want.keys()]
    for key in want.keys() & got.keys():
        for i, name in enumerate(HEADER[0].strip("| ").split(" | ")):
            a, b = want[key][i], got[key][i]
            if "SQNR" in name and a != "-" and b != "-":
                if key[1] == "x86" and not same_x86_recipe:
                    continue
                if abs(float(a) - float(b)) > SQNR_TOLERANCE:
                    problems.append(f"{key} {name}: measured {a}, the file says {b}")
            elif name != "notes" and a != b:
                problems.append(f"{key} {name}: measured {a}, the file says {b}")
    return sorted(problems)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.zoo.table", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/zoo.md disagrees with a fresh run")
    parser.add_argument("--out", type=Path, default=DOC, help="where to write the table (default docs/zoo.md)")
    parser.add_argument("--from", dest="logs", nargs="+", help="render these QUANTWEAVE_ZOO_LOG files, no measuring")
    parser.add_argument(
        "--allow-missing", action="store_true", help="with --from: rows the logs lack say 'not measured'"
    )
    args = parser.parse_args(argv)
    if args.logs:
        logged = from_log(args.logs)
        missing = [case for case in CASES if case not in logged]
        if missing and not args.allow_missing:
            parser.error(f"the logs have no measurement of {missing}")
        text = render(logged.get(case, Measurement(*case, error="not measured")) for case in CASES)
    else:
        text = render(measure(m, p) for m, p in CASES)
    if args.check:
        problems = differences(text, DOC.read_text())
        print("\n".join(problems) or f"{DOC} agrees with this run")
        return 1 if problems else 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

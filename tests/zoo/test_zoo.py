"""The zoo (issue #24): real architectures from ``transformers`` configs (random init, small
sizes) through x86 (inductor), xnnpack (ExecuTorch runtime) and the executorch "llm" preset,
against the peers measured in the same run (tests/zoo/measure.py says what is measured and
how). Tox env ``zoo``; docs/zoo.md is the table of this run (tests/zoo/table.py).

Each float model is exported once a run and shared by every plugin's flow: ours is given it
as it is and must leave it unchanged (a change is recorded as an error of ours, failing
``test_program_lowers_loads_and_runs``); the peer gets a deep copy (torchao's ``prepare_pt2e``
annotates and rewrites the graph it is given).

Held: every program of ours lowers, loads and runs; our coverage (weighted ops quantized) is
at least the peer's; where the coverage is equal our SQNR is not below the peer's by more
than 0.3 dB. Cases failing today for a gap another change is fixing are marked
``xfail(strict=True)`` with the gap named (drop the mark when the fix lands).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.zoo
pytest.importorskip("transformers", reason="needs transformers (tox -e zoo)")
pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e zoo)")
pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e", reason="needs torchao 0.18 (tox -e zoo)")

from . import counts, table  # noqa: E402
from .measure import CASES, changes, coverage, fingerprint, measure, zoo_model  # noqa: E402
from .models import BUILDERS  # noqa: E402

SQNR_MARGIN = 0.3  #: dB our SQNR may be below the peer's at equal coverage

#: (model, plugin, what) -> the gap, fixed on another branch, that makes the assertion fail today
KNOWN_GAPS: dict[tuple[str, str, str], str] = {}


def _cases(what: str) -> list[object]:
    params = []
    for model, plugin in CASES:
        gap = KNOWN_GAPS.get((model, plugin, what))
        marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
        params.append(pytest.param(model, plugin, marks=marks, id=f"{model}-{plugin}"))
    return params


@pytest.mark.parametrize(("model", "plugin"), _cases("loads"))
def test_program_lowers_loads_and_runs(model, plugin):
    m = measure(model, plugin)
    assert m.error is None, f"{model} through {plugin}: {m.error}"
    assert m.loads and m.runtime_sqnr is not None and math.isfinite(m.runtime_sqnr), m
    assert m.weighted > 0 and m.quantized > 0, f"{model} through {plugin}: coverage {m.coverage}"


@pytest.mark.parametrize(("model", "plugin"), _cases("coverage"))
def test_coverage_at_least_the_peers(model, plugin):
    m = measure(model, plugin)
    assert m.error is None or m.weighted, f"{model} through {plugin}: {m.error}"
    # held on the quantized counts: the totals of the two converted graphs may differ (measured:
    # Whisper's encoder through xnnpack, 14 weighted ops in ours, 15 in the peer's)
    if m.peer_error is not None:  # the peer failed: nothing to be below, but ours must quantize
        assert m.quantized > 0, f"{model} through {plugin}: coverage {m.coverage}; peer: {m.peer_error}"
        return
    assert m.quantized >= m.peer_quantized, f"{model} through {plugin}: ours {m.coverage}, peer {m.peer_coverage}"


@pytest.mark.parametrize(("model", "plugin"), _cases("sqnr"))
def test_sqnr_not_below_the_peers_at_equal_coverage(model, plugin):
    m = measure(model, plugin)
    assert m.sqnr is not None, f"{model} through {plugin}: {m.error}"
    if m.peer_sqnr is None or m.quantized != m.peer_quantized:
        assert m.peer_error is not None or m.quantized > (m.peer_quantized or 0), m
        return
    assert m.sqnr >= m.peer_sqnr - SQNR_MARGIN, (
        f"{model} through {plugin}: SQNR {m.sqnr:.2f} dB, peer {m.peer_sqnr:.2f} dB at coverage {m.coverage}"
    )


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_models_are_alive(name):
    """Activations do not vanish (batch-norm statistics and weights are set up), and building
    twice gives the same model (random init under a fixed seed)."""
    zoo = zoo_model(name)
    with torch.no_grad():
        out = zoo.model(*zoo.inputs)
    assert out.std().item() > 1e-2, f"{name}: output std {out.std().item():.2e}"
    assert not zoo.model.training


def test_coverage_counts_weights_through_dequantize_and_addmm():
    """The counter: a linear with a dequantized weight is quantized, an addmm whose weight is a
    float constant (GPT-2's Conv1D) is weighted but float, a matmul of two activations is not weighted."""

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))
            self.b = torch.nn.Parameter(torch.randn(4))
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = torch.addmm(self.b, x, self.w)
            return self.lin(y) @ y.t()

    gm = torch.export.export(M(), (torch.randn(2, 4),)).module()
    assert coverage(gm) == (0, 2)
    dequantize = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    linear = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default)
    with gm.graph.inserting_before(linear):
        dq = gm.graph.call_function(dequantize, (linear.args[1], 0.1, 0, -128, 127, torch.int8))
    linear.replace_input_with(linear.args[1], dq)
    assert coverage(gm) == (1, 2)


def test_changes_names_what_a_flow_changed_in_the_shared_model():
    """The check that ours leaves the shared exported model alone sees a rewritten graph, new
    node meta and a parameter changed in place, and nothing when nothing changed."""
    gm = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),)).module()
    before = fingerprint(gm)
    assert changes(before, gm) == []
    next(n for n in gm.graph.nodes if n.op == "call_function").meta["quantization_annotation"] = None
    assert changes(before, gm) == ["node meta"]
    with torch.no_grad():
        gm.weight.add_(1.0)
    assert changes(before, gm) == ["node meta", "weight"]
    linear = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default)
    with gm.graph.inserting_after(linear):
        relu = gm.graph.call_function(torch.ops.aten.relu.default, (linear,))
    linear.replace_all_uses_with(relu, delete_user_cb=lambda user: user is not relu)
    gm.recompile()
    assert changes(before, gm)[0] == "the graph's code"


def test_counts_count_each_step_and_write_them(tmp_path):
    """QUANTWEAVE_ZOO_COUNTS: a counted step is counted once a call and written to the file named
    at the end, with the process's CPU and its children's; nothing stays patched after the session."""
    original = torch.export.export
    out = tmp_path / "counts.tsv"
    session = counts.counting(str(out))
    calls, _ = next(session)
    assert torch.export.export is not original
    torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    assert calls == {"torch.export.export": 1}
    session.close()
    assert torch.export.export is original
    text = out.read_text()
    assert "torch.export.export\t1\t" in text
    assert "\nprocess\t-\t" in text and "\nchildren\t-\t" in text  # the g++ compiles are in children


def test_docs_table_agrees_with_this_run():
    """docs/zoo.md has every case, with this run's coverage and loads and SQNRs within the
    tolerance; QUANTWEAVE_ZOO_TABLE=PATH writes this run's table there (the CI artifact;
    PATH=docs/zoo.md regenerates the file)."""
    text = table.render(measure(m, p) for m, p in CASES)
    out = os.environ.get("QUANTWEAVE_ZOO_TABLE")
    if out:
        Path(out).write_text(text)
    doc = table.DOC.read_text()
    problems = table.differences(text, doc)
    if table.recipe_of(text) != table.recipe_of(doc):
        print(f"x86 SQNRs not compared: this run: {table.recipe_of(text)}; the file: {table.recipe_of(doc)}")
    assert not problems, "docs/zoo.md disagrees with this run (python -m tests.zoo.table):\n" + "\n".join(problems)


def test_x86_sqnrs_are_compared_only_under_the_same_recipe():
    """The x86 rows' SQNRs depend on the CPU's recipe (reduce_range without VNNI / AMX): a file
    measured under the other recipe is not held to them, every other cell still is, and a file
    without the recipe line is a difference."""
    rows = (
        "| vit | x86 | 7/7 | 35.1 | 35.1 | yes | 7/7 | 35.1 |  |",
        "| vit | xnnpack | 7/7 | 26.1 | 26.1 | yes | 7/7 | 26.1 |  |",
    )
    here = "\n".join(("intro", table.x86_recipe(), "", *table.HEADER, *rows))
    other_recipe = table._RECIPES[not table.x86_recipe().endswith(table._RECIPES[True])]
    there = here.replace(table.x86_recipe(), table.X86_RECIPE + other_recipe)
    x86_moved = there.replace("| 35.1 | 35.1 | yes | 7/7 | 35.1 |", "| 40.1 | 40.1 | yes | 7/7 | 40.1 |")
    assert table.differences(here, x86_moved) == []
    assert table.differences(here, x86_moved.replace("| 26.1 | 26.1 |", "| 28.1 | 26.1 |")) == [
        "('vit', 'xnnpack') SQNR (dB): measured 26.1, the file says 28.1"
    ]
    assert len(table.differences(here, here.replace("| 35.1 | 35.1 |", "| 40.1 | 35.1 |"))) == 1
    assert table.differences(here, x86_moved.replace("| 7/7 | 40.1 | 40.1", "| 6/7 | 40.1 | 40.1")) == [
        "('vit', 'x86') coverage: measured 7/7, the file says 6/7"
    ]
    assert table.differences(here, here.replace(table.x86_recipe(), "")) == [
        f"the file has no line that starts {table.X86_RECIPE!r}"
    ]

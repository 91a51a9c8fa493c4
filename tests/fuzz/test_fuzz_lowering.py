"""x86 lowering of generated models (issue #16): convert -> ``quantweave_x86.lower`` (inductor
with freezing, int8 kernels) -> run. torch.compile is slow (tens of seconds per model on 2
cores), so this runs a few examples per CI run (``budget("lowering")``).

On a CPU without VNNI / AMX (``quantweave_x86.cpu_needs_reduce_range()``), oneDNN's u8s8
kernels sum in 16 bits and saturate on full-range [0, 255] activations (``lower`` warns): the
configurations lowered here quantize with ``reduce_range=cpu_needs_reduce_range()``, as the
x86 plugin documents, so the property holds on any x86 CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

import quantweave as qw
import quantweave.authoring as qa
from tests.helpers import assert_names

from . import stats
from .conftest import budget
from .flow import QConfig, clone_inputs, configs, flat_outputs, inputs_unchanged, run_flow, sqnr
from .programs import Program, programs
from .properties import Case, error_problems

pytestmark = pytest.mark.fuzz

quantweave_x86 = pytest.importorskip("quantweave_x86")

#: lowered (oneDNN int8 kernels, requantized outputs) vs converted (reference q/dq in fp32)
LOWERED_SQNR_DB = 20.0


def _x86_configs() -> list[QConfig]:
    """Every x86 configuration of the flow tests, with ``reduce_range`` set where this CPU
    needs it (a configuration that asks for it keeps it; duplicates are dropped)."""
    needs = quantweave_x86.cpu_needs_reduce_range()
    out: dict[str, QConfig] = {}
    for config in configs():
        if len(config.members) != 1 or config.members[0][0].split(":")[-1] != "x86":
            continue
        name, options = config.members[0]
        if needs:
            options = tuple(sorted({**dict(options), "reduce_range": True}.items()))
        lowered = QConfig(((name, options),), config.mode)
        out.setdefault(lowered.label, lowered)
    return list(out.values())


@settings(max_examples=budget("lowering"))
@given(program=programs(max_steps=4, force_linear=True), config=st.sampled_from(_x86_configs()))
def test_x86_lowering_runs_and_agrees_with_the_converted_model(program: Program, config: QConfig) -> None:
    note(f"program:\n{program.describe()}")
    note(f"quantizer: {config}")
    case = Case.of(program, "lowering")
    assume(not case.non_finite)
    flow = run_flow(case.exported, config, case.calibration, case.test_inputs)
    stats.FLOWS[config.label] += 1
    assert not error_problems(flow, case), error_problems(flow, case)
    if flow.converted is None:
        return
    has_dq = any(n.target in qa.dequantize_ops() for n in flow.converted.graph.nodes)
    if not has_dq:
        with pytest.raises(ValueError) as info:
            quantweave_x86.lower(flow.converted, case.test_inputs)
        assert_names(info, "lower", "converted model", "no dequantize node")
        return
    inputs = clone_inputs(case.test_inputs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", qw.MisuseWarning)
        lowered = quantweave_x86.lower(flow.converted, inputs)
    misuse = [str(w.message) for w in caught if issubclass(w.category, qw.MisuseWarning)]
    assert not misuse, f"lower() warns about the configuration the fuzz lowers: {misuse}"
    out = flat_outputs(lowered(*inputs))
    assert inputs_unchanged(case.test_inputs, inputs), "lower or the lowered model modified its inputs"
    for i, (expected, got) in enumerate(zip(flow.outputs, out, strict=True)):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        if not torch.isfinite(expected).all():
            continue
        assert torch.isfinite(got).all(), f"output {i}: not finite after lowering"
        peak = float(expected.double().abs().max()) ** 2
        if expected.numel() > 1 and float(expected.double().var()) > 1e-8 * peak:
            assert sqnr(expected, got) > LOWERED_SQNR_DB, (
                f"output {i}: lowered vs converted {sqnr(expected, got):.1f} dB"
            )
    assert not case.untouched()

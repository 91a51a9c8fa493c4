"""Property-based fuzzing of the whole flow on generated models (issue #16).

Every example is a random exportable model (:mod:`tests.fuzz.programs`) run through
installed quantizers and compositions (:mod:`tests.fuzz.flow`):
export -> prepare -> calibrate -> convert -> run. The properties
(:mod:`tests.fuzz.properties`):

* never an exception that is not a documented quantweave error, and those name a node,
  an observer or a quantizer;
* converted outputs finite, and within the stated SQNR of float on a calibrated input;
* the report tells the truth about every vocabulary node, and lists every claimed node;
  nothing is quantized where no pattern its quantizer declares occurs;
* the caller's model (module, exported graph, node meta, state) and inputs are untouched,
  and convert leaves the prepared model untouched;
* prepare and convert are deterministic; quantization does not depend on the graph order
  of independent branches;
* QAT: prepare_qat_pt2e -> train steps -> eval -> convert runs and agrees with the
  fake-quantized model.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from torch.fx import GraphModule, Node

from quantweave.authoring import dequantize_ops, quantize_ops
from quantweave.observers import FakeQuantize, FakeQuantizeBase
from quantweave.plugin_api import ANNOTATION_KEY
from quantweave.testing.inspect import qdq_summary

from . import stats
from .conftest import budget
from .flow import QConfig, configs, flat_outputs, qat_configs, run_flow, same_values, sqnr, trainable
from .programs import Branch, Op, Program, programs, swap_branches
from .properties import (
    CONDITIONED_DB,
    SQNR_BOUND_DB,
    Case,
    all_problems,
    error_problems,
    noise_sqnr,
    noise_sqnr_draws,
    output_problems,
)

pytestmark = pytest.mark.fuzz


def _describe(program: Program, chosen: Any) -> None:
    note(f"program:\n{program.describe()}")
    note(f"quantizers: {[str(c) for c in chosen] if isinstance(chosen, list) else chosen}")


def _skip_non_finite(case: Case) -> None:
    """A float model computing inf / NaN on the calibration data is garbage in (see
    docs/fuzzing.md): counted, and not judged."""
    if case.non_finite:
        stats.GAPS["float model computes inf/NaN (not judged)"] += 1
    assume(not case.non_finite)


@settings(max_examples=budget("flow"))
@given(
    program=programs(),
    chosen=st.lists(st.sampled_from(configs()), min_size=1, max_size=3, unique_by=lambda c: c.label),
)
def test_flow_holds_on_generated_models(program: Program, chosen: list[QConfig]) -> None:
    _describe(program, chosen)
    case = Case.of(program, "flow")
    _skip_non_finite(case)
    problems: list[str] = []
    for config in chosen:
        flow = run_flow(case.exported, config, case.calibration, case.test_inputs)
        stats.FLOWS[config.label] += 1
        problems += all_problems(flow, case)
    problems += case.untouched()
    assert not problems, "\n".join(problems)


#: shrunk from the fuzz-full run (template, static): attention over inputs scaled by 1e3
#: saturates its softmax (logits of +-1e5..1e6), and in one row the two largest logits
#: differ by 0.8 % (213294 vs 214935), less than what 8-bit q / k move them by
NEAR_TIE = Program(
    input_kind="sequence",
    input_shape=(1, 4, 7),
    input_dtype=torch.float32,
    steps=(
        Op("attention", "operator", (7, 7), (1, 4, 7), (1, 4, 7)),
        Op("flatten", "module", (1,), (1, 4, 7), (1, 28)),
        Op("extra_input", "operator", ("add", 1), (1, 28), (1, 28)),
        Op("reshape", "method", ((2, 14),), (1, 28), (1, 2, 14)),
        Op("permute", "method", ((0, 2, 1),), (1, 2, 14), (1, 14, 2)),
        Op("extra_input", "operator", ("add", 2), (1, 14, 2), (1, 14, 2)),
    ),
    extra_inputs=((1, 28), (1, 1, 2)),
    seed=157,
    input_scale=1000.0,
)


def _config(label: str) -> QConfig:
    return next(c for c in configs() if c.label == label)


def test_a_softmax_near_tie_is_ill_conditioned_under_another_noise_draw() -> None:
    """The template flips the near tie (12.0 dB); the noise model's first draw does not
    (43.6 dB), others do (below the 15 dB bound themselves): the output is counted as
    ill-conditioned, not failed."""
    case = Case.of(NEAR_TIE, "pinned")
    flow = run_flow(case.exported, _config("template:template[static]"), case.calibration, case.test_inputs)
    assert sqnr(case.reference[0], flow.outputs[0]) < SQNR_BOUND_DB[8]
    assert noise_sqnr(case, 8)[0] >= CONDITIONED_DB[8]
    assert min(draw[0] for draw in noise_sqnr_draws(case, 8)) < SQNR_BOUND_DB[8]
    before = stats.GAPS["ill-conditioned under another noise draw (SQNR not bounded)"]
    assert output_problems(flow, case) == []
    assert stats.GAPS["ill-conditioned under another noise draw (SQNR not bounded)"] == before + 1


def test_a_well_conditioned_output_is_judged_on_every_noise_draw() -> None:
    """The other draws excuse only a tie: a linear's output keeps >= 30 dB on all of them,
    so a converted output off by 50 % (6 dB) is still a failure (an output is excused only
    when plain noise on another draw falls below the 15 dB bound itself)."""
    program = Program(
        input_kind="features",
        input_shape=(2, 8),
        input_dtype=torch.float32,
        steps=(Op("linear", "module", (8, 8, True, False), (2, 8), (2, 8)),),
        seed=3,
    )
    case = Case.of(program, "pinned")
    flow = run_flow(case.exported, _config("x86:x86[static]"), case.calibration, case.test_inputs)
    assert min(draw[0] for draw in [noise_sqnr(case, 8), *noise_sqnr_draws(case, 8)]) >= CONDITIONED_DB[8]
    flow.outputs = [case.reference[0] * 1.5]
    problems = output_problems(flow, case)
    assert len(problems) == 1 and problems[0].startswith("output 0: SQNR 6.0 dB < 15.0 dB"), problems


# -- determinism -----------------------------------------------------------------------------


def _spec_summary(gm: GraphModule) -> list[tuple[str, str, Any]]:
    out = []
    for node in gm.graph.nodes:
        annotation = node.meta.get(ANNOTATION_KEY)
        specs: Any = None
        if annotation is not None:
            specs = (
                sorted((p.name, repr(s)) for p, s in annotation.input_qspec_map.items()),
                repr(annotation.output_qspec),
            )
        out.append((node.name, f"{node.op}:{node.target}", specs))
    return out


@settings(max_examples=budget("deterministic"))
@given(program=programs(), config=st.sampled_from(configs()))
def test_prepare_and_convert_are_deterministic(program: Program, config: QConfig) -> None:
    """The same exported graph prepared twice gives the same nodes, the same annotations
    and observers; after the same calibration, the same q/dq ops, scales and zero points,
    and bit-identical outputs."""
    _describe(program, config)
    case = Case.of(program, "deterministic")
    _skip_non_finite(case)
    a = run_flow(case.exported, config, case.calibration, case.test_inputs)
    b = run_flow(case.exported, config, case.calibration, case.test_inputs)
    stats.FLOWS[config.label] += 2
    assert not error_problems(a, case), error_problems(a, case)
    assert (type(a.error), str(a.error), a.stage) == (type(b.error), str(b.error), b.stage)
    if a.prepared is not None and b.prepared is not None:
        assert _spec_summary(a.prepared) == _spec_summary(b.prepared)
        assert [n for n, _ in a.prepared.named_modules()] == [n for n, _ in b.prepared.named_modules()]
    if a.converted is not None and b.converted is not None:
        assert [(n.name, n.op, str(n.target)) for n in a.converted.graph.nodes] == [
            (n.name, n.op, str(n.target)) for n in b.converted.graph.nodes
        ]
        assert qdq_summary(a.converted) == qdq_summary(b.converted)
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert same_values(x, y)
    assert not case.untouched()


# -- graph order of independent branches -----------------------------------------------------


def _layer(node: Node) -> str:
    """The program layer (``layers.<i>``) a node was made by, whatever its graph position."""
    paths = [p for p, _ in node.meta.get("nn_module_stack", {}).values() if p.startswith("layers.")]
    return ".".join(min(paths, key=len).split(".")[:2]) if paths else "<top>"


def _dequantize_params(gm: GraphModule, node: Node) -> tuple[Any, ...]:
    from quantweave.testing.inspect import _literal

    return tuple(_literal(gm, a) for a in node.args[1:])


def _decisions(gm: GraphModule) -> dict[tuple[str, str, int], Any]:
    """For every compute node, keyed by (layer, op, index within the layer): the q/dq
    parameters of each of its inputs (None: float)."""
    dq = set(dequantize_ops())
    seen: dict[tuple[str, str], int] = {}
    out: dict[tuple[str, str, int], Any] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "output") or node.target in dq or node.target in quantize_ops():
            continue
        base = (_layer(node), str(node.target))
        index = seen.get(base, 0)
        seen[base] = index + 1
        inputs = []
        for arg in node.all_input_nodes:
            inputs.append(_dequantize_params(gm, arg) if arg.target in dq else None)
        out[(*base, index)] = tuple(inputs)
    return out


def _has_branch(program: Program) -> bool:
    return any(isinstance(s, Branch) for s in program.steps)


@settings(max_examples=budget("order"))
@given(program=programs(force_branch=True), config=st.sampled_from(configs()))
def test_branch_order_does_not_change_quantization(program: Program, config: QConfig) -> None:
    """The same model with every pair of independent branches evaluated in the other
    order (so the exported graph lists them the other way round) gets, node for node, the
    same q/dq decisions, scales and zero points."""
    assert _has_branch(program)
    swapped = swap_branches(program)
    _describe(program, config)
    # the swapped program computes the same values: only the first is checked for inf / NaN
    first, second = Case.of(program, "order"), Case.of(swapped, "order", ranges=False)
    _skip_non_finite(first)
    assert [str(n.target) for n in first.exported.graph.nodes] != [] and first.reference
    a = run_flow(first.exported, config, first.calibration, first.test_inputs)
    b = run_flow(second.exported, config, second.calibration, second.test_inputs)
    stats.FLOWS[config.label] += 2
    assert not error_problems(a, first) and not error_problems(b, second)
    assert (type(a.error), a.stage) == (type(b.error), b.stage)
    if a.converted is None or b.converted is None:
        return
    da, db = _decisions(a.converted), _decisions(b.converted)
    assert da.keys() == db.keys()
    different = {k: (da[k], db[k]) for k in da if da[k] != db[k]}
    assert not different, f"decisions depend on branch order: {different}"
    for x, y in zip(a.outputs, b.outputs, strict=True):
        assert same_values(x, y)


# -- QAT -------------------------------------------------------------------------------------


@settings(max_examples=budget("qat"))
@given(program=programs(dynamic=False, min_batch=2), config=st.sampled_from(qat_configs()))
def test_qat_flow_holds_on_generated_models(program: Program, config: QConfig) -> None:
    """Training-mode export -> prepare_qat_pt2e -> two training steps -> eval -> convert:
    no undocumented error, finite outputs, the converted model agrees with the
    fake-quantized one (same qparams; batch norm folded), the caller's model untouched."""
    _describe(program, config)
    case = Case.of(program, "qat", train=True)
    backward = trainable(case.model, case.calibration[0])
    flow = run_flow(case.exported, config, case.calibration[:2], case.test_inputs, qat=True, backward=backward)
    stats.FLOWS[config.label] += 1
    assert not error_problems(flow, case), error_problems(flow, case)
    assert not flow.convert_changes, flow.convert_changes
    if flow.converted is not None and flow.prepared is not None:
        if _eps_mismatch(flow.prepared):
            stats.GAPS["qat-fused-fake-quant-ignores-observer-eps"] += 1
            return
        if program.divides_by_activation:  # c / x: a rounding difference near x = 0 is unbounded
            stats.GAPS["division by an activation quantized to 0 (not bounded)"] += 1
            return
        # freeze the observers (the fused fake-quantizer still chooses its qparams from their
        # ranges in its kernel, not as convert does: the known gaps below)
        for module in flow.prepared.modules():
            if isinstance(module, FakeQuantizeBase):
                module.disable_observer()
        with torch.no_grad():
            simulated = flat_outputs(flow.prepared(*case.test_inputs))
        for i, (sim, out) in enumerate(zip(simulated, flow.outputs, strict=True)):
            if not torch.isfinite(sim).all():
                continue
            assert torch.isfinite(out).all(), f"output {i} not finite after convert"
            peak = float(sim.double().abs().max()) ** 2
            if sim.numel() <= 1 or float(sim.double().var()) <= 1e-8 * peak or sqnr(sim, out) > QAT_SQNR_DB:
                continue
            if _symmetric_qparams_mismatch(flow.prepared):
                # the known gap, only where it explains the difference: with the qparams
                # convert uses, the fake-quantized model must agree with the converted one
                at_convert = flat_outputs(_simulate_with_convert_qparams(flow.prepared, case.test_inputs))
                if sqnr(at_convert[i], out) > QAT_SQNR_DB:
                    stats.GAPS["qat-fused-fake-quant-chooses-other-symmetric-qparams"] += 1
                    continue
            raise AssertionError(f"output {i}: converted vs fake-quantized {sqnr(sim, out):.1f} dB")
    assert not case.untouched()


#: converted vs the fake-quantized (QAT-prepared, eval mode) model: the same observers, so
#: they differ by rounding at quantize boundaries, the batch-norm fold, and where torch's
#: fused fake-quantizer chooses other qparams than convert (the known gaps below)
QAT_SQNR_DB = 20.0


def _eps_mismatch(prepared: GraphModule) -> bool:
    """Known gap (test_qat_fake_quantizer_trains_with_the_scale_convert_uses): torch's fused
    fake-quantizer computes its scale without the observer's ``eps``, and convert takes the
    observer's eps-clamped qparams, so on tensors whose range is below 255 * eps the two
    disagree (torchao 0.18 does the same)."""
    for module in prepared.modules():
        observer = getattr(module, "activation_post_process", None)
        eps = getattr(observer, "eps", None)
        if not isinstance(module, FakeQuantizeBase) or eps is None:
            continue
        used = module.scale.detach().flatten()
        if used.numel() and float(used.min()) < float(eps) <= float(module.calculate_qparams()[0].min()):
            return True
    return False


_SYMMETRIC = (torch.per_tensor_symmetric, torch.per_channel_symmetric)


def _symmetric_qparams_mismatch(prepared: GraphModule) -> bool:
    """Known gap (test_qat_fake_quantizer_trains_with_the_symmetric_qparams_convert_uses):
    torch's fused fake-quantizer chooses its qparams in its kernel (ATen's
    ``ChooseQuantizationParams``), not with its observer's ``calculate_qparams``, which
    convert uses: for a symmetric int8 weight channel its scale is max(-min / 128, max / 127)
    where the observer's is max(-min, max) / 127.5, and a channel whose weights are all of
    one sign gets an affine scale and zero point (e.g. 0.0017, 127 instead of 0.0034, 0);
    torchao 0.18 does the same. True when a fake-quantizer with a symmetric qscheme used
    qparams other than convert's (read after an eval forward: the kernel writes what it used)."""
    for module in prepared.modules():
        if not isinstance(module, FakeQuantizeBase) or getattr(module, "qscheme", None) not in _SYMMETRIC:
            continue
        scale, zero_point = module.calculate_qparams()
        used_scale, used_zero_point = module.scale.detach(), module.zero_point.detach()
        if used_scale.shape != scale.shape or used_zero_point.shape != zero_point.shape:
            continue
        if not torch.equal(used_scale, scale.to(used_scale.dtype)) or not torch.equal(
            used_zero_point, zero_point.to(used_zero_point.dtype)
        ):
            return True
    return False


class _AtConvertQParams(torch.fx.Interpreter):
    """Runs a QAT-prepared model with every (enabled) fake-quantizer applying the qparams
    ``convert_pt2e`` takes (``calculate_qparams()``) instead of those its kernel chooses."""

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        module = self.fetch_attr(str(target))
        if not isinstance(module, FakeQuantize) or not bool(module.fake_quant_enabled[0]):
            return super().call_module(target, args, kwargs)
        scale, zero_point = module.calculate_qparams()
        low, high = module.quant_min, module.quant_max
        if module.is_per_channel:
            return torch.fake_quantize_per_channel_affine(
                args[0], scale, zero_point.to(torch.int32), module.ch_axis, low, high
            )
        return torch.fake_quantize_per_tensor_affine(args[0], float(scale), int(zero_point), low, high)


def _simulate_with_convert_qparams(prepared: GraphModule, inputs: tuple[torch.Tensor, ...]) -> Any:
    with torch.no_grad():
        return _AtConvertQParams(prepared).run(*inputs)

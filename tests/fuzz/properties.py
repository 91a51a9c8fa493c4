"""The properties every generated model must satisfy, as functions returning problems.

Each check returns a list of problems in words (empty: the property holds). The tests
assert the list is empty, so a failure prints every broken property of the example.

Known gaps (xnnpack's clamps after a wide input; QAT's eps and symmetric qparams, in
test_fuzz_flow.py) are excused *narrowly*, and each is pinned by a strict xfail in
``tests/integration/test_fuzz_regressions.py``: when a gap is closed, its xfail passes, the
strict marker fails the suite, and the excuse must be removed with it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx._lazy_graph_module import _use_lazy_graph_module

import quantweave as qw
from quantweave.plugin_api import ANNOTATED_BY_KEY, ANNOTATION_KEY, SKIP_REASON_KEY

from . import stats
from .flow import (
    DOCUMENTED_ERRORS,
    Flow,
    QConfig,
    Snapshot,
    clone_inputs,
    flat_outputs,
    functional_name,
    inputs_unchanged,
    members,
    names_something,
    occurrences,
    sqnr,
)
from .programs import Program, build, dynamic_shapes, example_inputs, op_kinds

# -- the SQNR bounds -------------------------------------------------------------------------

#: converted vs float output SQNR (dB) required on a calibrated input, by weight width, for
#: a well-conditioned output: one the float model itself keeps above :data:`CONDITIONED_DB`
#: under the noise model (:func:`noise_sqnr`: quantization-like noise on every tensor)
SQNR_BOUND_DB = {8: 15.0, 4: 10.0}
CONDITIONED_DB = {8: 30.0, 4: 20.0}
#: an output whose variance is below this fraction of its squared peak is ~constant: its
#: SQNR says nothing about quantization (e.g. softmax over one element, relu of negatives)
FLAT_OUTPUT = 1e-8


def weight_bits(config: QConfig) -> int:
    for _, options in config.members:
        opts = dict(options)
        if opts.get("weight_qmin", -128) >= -8 and opts.get("weight_qmax", 127) <= 7:
            return 4
    return 8


# -- known gaps, each with a strict xfail twin in tests/integration/test_fuzz_regressions.py


def _base_name(label: str) -> str:
    return label.split("#")[0]


# -- one generated model, exported once, with what the flows must leave untouched ------------


def export(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dynamic: Any) -> GraphModule:
    """``torch.export.export(model, inputs, dynamic_shapes=dynamic).module()``, the export traced with
    torch's lazy graph modules (issue #23: the export is most of the fuzz env's CPU, and it generates
    and compiles the Python code of intermediate graph modules that are never run; lazily, 5 code
    generations per export instead of 10). ``.module()`` is called outside that mode: the flows
    get an ordinary GraphModule, with the same code, state and node meta as without it (checked on 150
    generated programs), and the export itself (tracing, fake tensors, decompositions) is unchanged."""
    with _use_lazy_graph_module(True):
        program = torch.export.export(model, inputs, dynamic_shapes=dynamic)
    return program.module()


@dataclass
class Case:
    program: Program
    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    exported: GraphModule
    calibration: list[tuple[torch.Tensor, ...]]
    test_inputs: tuple[torch.Tensor, ...]
    reference: list[torch.Tensor]
    snapshot: Snapshot
    model_state: dict[str, torch.Tensor]
    input_copies: list[tuple[torch.Tensor, ...]] = field(default_factory=list)
    ranges: dict[str, tuple[float, float]] | None = None
    #: nodes of the float model that compute inf / NaN on calibration data: such a model
    #: is outside what the fuzz judges (see docs/fuzzing.md, "What remains unverified")
    non_finite: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, program: Program, test: str, train: bool = False, ranges: bool = True) -> Case:
        """``ranges=False``: the float model's ranges and non-finite nodes are not recorded
        (a run over every calibration batch): for a case that is only compared with another
        one, already judged (the branch-order test's swapped program)."""
        model = build(program)
        if train:
            model.train()
        inputs = example_inputs(program, 0)
        exported = export(model, inputs, dynamic_shapes(program))
        stats.record_model(test, op_kinds(program), exported)
        batch = (lambda s: 2 + s % 2) if program.dynamic_batch else (lambda s: None)
        test_inputs = example_inputs(program, 99)
        # the test input is one of the calibration batches: the SQNR bound measures
        # quantization noise, not how well a few tiny batches predict unseen ranges
        calibration = [example_inputs(program, s, batch=batch(s)) for s in (1, 2, 3)] + [test_inputs]
        with torch.no_grad():
            reference = flat_outputs(exported(*clone_inputs(test_inputs))) if not train else []
        # after the reference run: the exported module may share buffers with the nn.Module
        model_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        case = cls(
            program,
            model,
            inputs,
            exported,
            calibration,
            test_inputs,
            reference,
            Snapshot.of(exported),
            model_state,
        )
        case.input_copies = [clone_inputs(b) for b in (inputs, *calibration)]
        if not train and ranges:
            case.ranges, case.non_finite = float_ranges(case)
        return case

    def untouched(self) -> list[str]:
        """The caller's model (nn.Module and exported), and every input, as they were."""
        problems = [f"exported model: {d}" for d in self.snapshot.differences(self.exported)]
        for name, value in self.model.state_dict().items():
            if not torch.equal(value, self.model_state[name]):
                problems.append(f"the nn.Module's {name!r} changed")
        for i, (now, before) in enumerate(zip((self.inputs, *self.calibration), self.input_copies, strict=True)):
            if not inputs_unchanged(before, now):
                problems.append(f"input batch {i} was modified")
        return problems


# -- properties of one flow ------------------------------------------------------------------


def error_problems(flow: Flow, case: Case) -> list[str]:
    """Never an exception that is not a documented quantweave error; those name a node,
    an observer or a quantizer."""
    if flow.error is None:
        return []
    exc = flow.error
    where = f"{flow.stage}: {type(exc).__name__}: {exc}"
    if not isinstance(exc, DOCUMENTED_ERRORS):
        return [f"undocumented exception at {where}"]
    stats.ERRORS[type(exc).__name__] += 1
    names = {n.name for n in case.exported.graph.nodes}
    for gm in (flow.prepared, flow.converted):
        if gm is not None:
            names |= {n.name for n in gm.graph.nodes} | {n for n, _ in gm.named_modules()}
    if flow.quantizer is not None:
        names |= {label for label, _ in members(flow.quantizer)}
    if not names_something(str(exc), names):
        return [f"documented error names no node, observer or quantizer: {where}"]
    return []


def output_problems(flow: Flow, case: Case) -> list[str]:
    """Converted outputs are finite where the float ones are, and, where the float model
    is well-conditioned, within the SQNR bound of float."""
    problems: list[str] = []
    if flow.error is not None or flow.converted is None:
        return problems
    if len(flow.outputs) != len(case.reference):
        return [f"converted model returns {len(flow.outputs)} tensors, the float one {len(case.reference)}"]
    bits = weight_bits(flow.config)
    bound = SQNR_BOUND_DB[bits]
    conditioned: list[float] | None = None
    other_draws: list[list[float]] | None = None
    for i, (ref, out) in enumerate(zip(case.reference, flow.outputs, strict=True)):
        if ref.shape != out.shape or ref.dtype != out.dtype:
            problems.append(f"output {i}: {tuple(out.shape)} {out.dtype}, float gives {tuple(ref.shape)} {ref.dtype}")
            continue
        if not ref.is_floating_point() or not torch.isfinite(ref).all():
            continue
        if not torch.isfinite(out).all():
            if case.program.divides_by_activation:
                stats.GAPS["division by an activation quantized to 0 (not bounded)"] += 1
                continue
            problems.append(f"output {i}: not finite after convert (the float output is)")
            continue
        peak = float(ref.double().abs().max()) ** 2
        if ref.numel() < 2 or float(ref.double().var()) <= FLAT_OUTPUT * peak:
            continue
        value = sqnr(ref, out)
        if value >= bound:
            continue
        conditioned = conditioned if conditioned is not None else noise_sqnr(case, bits)
        if conditioned[i] < CONDITIONED_DB[bits]:
            stats.GAPS["ill-conditioned output (SQNR not bounded)"] += 1
            continue
        other_draws = other_draws if other_draws is not None else noise_sqnr_draws(case, bits)
        if min(draw[i] for draw in other_draws) < bound:
            stats.GAPS["ill-conditioned under another noise draw (SQNR not bounded)"] += 1
            continue
        gap = sqnr_gap(flow, case)
        if gap is not None:
            stats.GAPS[gap] += 1
            continue
        problems.append(
            f"output {i}: SQNR {value:.1f} dB < {bound} dB (the float model keeps {conditioned[i]:.1f} dB "
            "under the noise model)"
        )
    return problems


#: ops xnnpack quantizes with its input's qparams (ExecuTorch's recipe): when the output's
#: range is a small part of the input's, the shared step wipes it out (xnnpack, known
#: recipe limitation; test_xnnpack_hardtanh_after_a_wide_input_keeps_its_output)
XNNPACK_CLAMPS = frozenset({"aten.hardtanh.default", "aten.relu6.default", "aten.relu.default", "aten.clamp.default"})
#: how much narrower than its input an output must be for the shared step to wipe it out
CLAMP_RATIO = 16.0


def sqnr_gap(flow: Flow, case: Case) -> str | None:
    """The known gap that explains a low SQNR, if any."""
    if flow.prepared is None or flow.quantizer is None or case.ranges is None:
        return None
    default = members(flow.quantizer)[0][0]
    for node in flow.prepared.graph.nodes:
        annotation = node.meta.get(ANNOTATION_KEY)
        if str(node.target) not in XNNPACK_CLAMPS or annotation is None:
            continue
        if not _base_name(str(node.meta.get(ANNOTATED_BY_KEY, default))).startswith("xnnpack"):
            continue
        if not isinstance(annotation.output_qspec, qw.SharedQuantizationSpec):
            continue
        source = node.args[0]
        if not isinstance(source, Node):
            continue
        while source.op == "call_module":  # through the observer to the producer
            source = source.args[0]  # type: ignore[assignment]
        before, after = case.ranges.get(source.name), case.ranges.get(node.name)
        if before is None or after is None:
            continue
        if (before[1] - before[0]) > CLAMP_RATIO * max(after[1] - after[0], MIN_SCALE):
            return "xnnpack-clamp-shares-a-wide-input-range"
    return None


def cap_ops(cap: Any) -> tuple[str, ...]:
    """A capability's op chain. Every capability carries its ops (a core pattern's from the
    vocabulary, a contributed one's -- onnxruntime's split, resize -- from its plugin), so
    the vocabulary fallback this once needed is gone: an empty chain is a defect, named."""
    ops = tuple(cap.ops)
    assert ops, f"capability {cap.pattern!r} of {cap.plugin or cap.quantizer or '?'} declares no ops"
    return ops


def _declared_ops(quantizer: qw.Quantizer) -> dict[str, list[tuple[str, Any]]]:
    """op -> [(member label, capability)] over the members' declarations (every mode: a
    composition may mix modes, e.g. static ops with weight-only embedding tables)."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for label, member in members(quantizer):
        for cap in member.quantization_capabilities():
            for op in cap_ops(cap):
                out.setdefault(op, []).append((label, cap))
    return out


def report_problems(flow: Flow, case: Case) -> list[str]:
    """The report tells the truth: every float vocabulary node has a reason that is not
    'unexplained'; 'undeclared' only where no member declares the op; every node a
    quantizer claimed is listed."""
    if flow.prepared is None or flow.quantizer is None:
        return []
    report = qw.annotation_report(flow.prepared, flow.quantizer)
    declared = _declared_ops(flow.quantizer)
    problems: list[str] = []
    listed = {row.node for row in report.nodes}
    for row in report.nodes:
        if row.status == "float" and not row.reason:
            problems.append(f"{row.node} ({row.op}) is float with no reason")
        if row.kind == "unexplained":  # no excuse left (the template's relu, issue #13, has a reason)
            problems.append(f"{row.node} ({row.op}) is float, unexplained: {row.reason}")
        if row.kind == "undeclared" and functional_name(row.op) in declared:
            who = sorted({label for label, _ in declared[functional_name(row.op)]})
            problems.append(f"{row.node} ({row.op}) reported undeclared, but {who} declare a pattern with it")
    for node in flow.prepared.graph.nodes:
        annotation = node.meta.get(ANNOTATION_KEY)
        if node.op != "call_function" or annotation is None or node.name in listed:
            continue
        if not getattr(annotation, "_annotated", False) or SKIP_REASON_KEY in node.meta:
            continue
        problems.append(f"{node.name} ({node.target}) was claimed by a quantizer but the report does not list it")
    return problems


def declaration_problems(flow: Flow, case: Case) -> list[str]:
    """Nothing is quantized where no declared pattern occurs: every node a member put a
    spec on is in an occurrence of a pattern that member declares (a node counts as its
    vocabulary op: in place as the functional op, a string-padding conv as the conv). No
    known gap is excused here."""
    if flow.prepared is None or flow.quantizer is None:
        return []
    gm = flow.prepared
    covered: dict[str, set[Node]] = {}
    for label, member in members(flow.quantizer):
        nodes = covered.setdefault(label, set())  # nested compositions may repeat a label
        for cap in member.quantization_capabilities():
            nodes.update(n for occ in occurrences(gm, cap_ops(cap), functional=True) for n in occ)
    problems = []
    default = members(flow.quantizer)[0][0]
    for node in gm.graph.nodes:
        annotation = node.meta.get(ANNOTATION_KEY)
        if node.op != "call_function" or annotation is None:
            continue
        specs = [annotation.output_qspec, *annotation.input_qspec_map.values()]
        if all(s is None for s in specs):
            continue
        by = str(node.meta.get(ANNOTATED_BY_KEY, default))
        if node in covered.get(by, set()):
            continue
        problems.append(f"{by} quantized {node.name} ({node.target}) where none of its patterns occurs")
    return problems


def all_problems(flow: Flow, case: Case) -> list[str]:
    problems = error_problems(flow, case)
    problems += output_problems(flow, case)
    problems += report_problems(flow, case)
    problems += declaration_problems(flow, case)
    problems += flow.convert_changes
    return [f"[{flow.config.label}] {p}" for p in problems]


# -- the noise model: how much the float model itself amplifies 8-bit noise -----------------


#: the smallest activation scale of the first-party recipes (x86, xnnpack: observers built
#: with ``eps=2**-12``, as the PT2E peers do): a tensor much smaller than it quantizes to 0
MIN_SCALE = 2.0**-12


class _Ranges(torch.fx.Interpreter):
    """Records, over calibration batches, the range of every float tensor of the graph, and
    whether any is not finite."""

    def __init__(self, gm: GraphModule) -> None:
        super().__init__(gm)
        self.ranges: dict[str, tuple[float, float]] = {}
        self.non_finite: list[str] = []

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, torch.Tensor) and result.is_floating_point() and result.numel():
            if not bool(torch.isfinite(result).all()):
                self.non_finite.append(n.name)
            finite = result[torch.isfinite(result)]
            if finite.numel():
                low, high = float(finite.min()), float(finite.max())
                old = self.ranges.get(n.name, (low, high))
                self.ranges[n.name] = (min(old[0], low), max(old[1], high))
        return result


class _Noisy(torch.fx.Interpreter):
    """Runs the float graph with the noise of an affine per-tensor quantizer added to every
    float tensor it computes or reads: uniform, one step = calibrated range / (2**bits - 1)
    (activations: ``bits`` and at least :data:`MIN_SCALE`; parameters and buffers:
    ``weight_bits``). A stand-in for quantization that knows nothing of quantweave (every
    tensor gets noise, nothing is clipped), with a fixed seed."""

    def __init__(self, gm: GraphModule, ranges: dict[str, tuple[float, float]], bits: int, weight_bits: int) -> None:
        super().__init__(gm)
        self.ranges, self.bits, self.weight_bits = ranges, bits, weight_bits
        self.generator = torch.Generator().manual_seed(0)

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if n.op not in ("call_function", "get_attr", "placeholder") or not isinstance(result, torch.Tensor):
            return result
        if not result.is_floating_point() or result.numel() == 0 or not torch.isfinite(result).all():
            return result
        bits = self.weight_bits if n.op == "get_attr" else self.bits
        low, high = self.ranges.get(n.name, (float(result.min()), float(result.max())))
        step = (max(high, 0.0) - min(low, 0.0)) / (2**bits - 1)
        if n.op != "get_attr":
            step = max(step, MIN_SCALE)
        noise = (torch.rand(result.shape, generator=self.generator, dtype=torch.float64) - 0.5) * step
        return (result.double() + noise).to(result.dtype)


def float_ranges(case: Case) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """The calibrated range of every float tensor of the float model, and the nodes that
    computed inf or NaN on a calibration batch (run on a copy: buffers may be written)."""
    recorder = _Ranges(copy.deepcopy(case.exported))
    with torch.no_grad():
        for batch in case.calibration:
            recorder.run(*clone_inputs(batch))
    return recorder.ranges, recorder.non_finite


def noise_sqnr(case: Case, weight_bits: int, seed: int = 0) -> list[float]:
    """Per output: SQNR of the float model under the noise model (see :class:`_Noisy`), one
    draw of the noise (``seed``)."""
    reference_model = copy.deepcopy(case.exported)  # its buffers may be written in forward
    if case.ranges is None:
        case.ranges, _ = float_ranges(case)
    noisy_model = _Noisy(reference_model, case.ranges, 8, weight_bits)
    noisy_model.generator.manual_seed(seed)
    with torch.no_grad():
        noisy = noisy_model.run(*clone_inputs(case.test_inputs))
    return [sqnr(ref, out) for ref, out in zip(case.reference, flat_outputs(noisy), strict=True)]


#: further draws of the noise model (seeds 1..) taken for an output below the SQNR bound that
#: the first draw found well-conditioned: an output that selects among nearly tied values (a
#: softmax saturated by logits of +-1e5 whose two largest differ by 1 %, an argmax) is a
#: step function of the noise, and one draw may not flip the tie while quantization does
#: (the fuzz-full run's attention -> ... case: 43.6 dB on seed 0, 11.2-46.7 dB on seeds 0-19).
#: Such an output is excused only when plain noise itself, on another draw, falls below the
#: bound the quantized model is held to (seeds 1-7 there: 11.2 and 11.3 dB): an output whose
#: other draws merely dip under the 30 dB conditioning line (28-30 dB) is still judged.
NOISE_DRAWS = 7


def noise_sqnr_draws(case: Case, weight_bits: int, draws: int = NOISE_DRAWS) -> list[list[float]]:
    """:func:`noise_sqnr` on ``draws`` further draws (seeds 1 to ``draws``)."""
    return [noise_sqnr(case, weight_bits, seed) for seed in range(1, draws + 1)]


# -- a batch the exported program rejects changes no observer (issue #20) ------------------------

_MODULE_INTERNALS = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}


def observer_state(prepared: GraphModule) -> dict[str, Any]:
    """The observers' state dicts as raw bits, and their Python attributes: what a rejected
    batch must leave exactly as it was. (Not the model's own buffers: a model that writes a
    buffer in forward has written it when an observer fails later in the same forward;
    calibrate restores observers, not the model.)"""
    observers = [(n, m) for n, m in prepared.named_modules() if qw.observers.is_observer_module(m)]
    state = {
        k: (v.dtype, tuple(v.shape), v.detach().reshape(-1).clone().view(torch.uint8) if v.dtype != torch.bool else v)
        for name, m in observers
        for k, v in m.state_dict(prefix=f"{name}.").items()
    }
    attributes = {name: {k: v for k, v in vars(m).items() if k not in _MODULE_INTERNALS} for name, m in observers}
    return {"state": state, "attributes": attributes}


def observer_state_problems(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    problems = []
    if before["state"].keys() != after["state"].keys():
        problems.append(f"state dict keys changed: {sorted(set(before['state']) ^ set(after['state']))}")
    for key, (dtype, shape, bits) in before["state"].items():
        if key not in after["state"]:
            continue
        now = after["state"][key]
        if now[0] != dtype or now[1] != shape or not torch.equal(now[2], bits):
            problems.append(f"{key} changed")
    for name, attrs in before["attributes"].items():
        now = after["attributes"].get(name, {})
        for k, v in attrs.items():
            if k not in now or not (now[k] is v or now[k] == v):
                problems.append(f"{name}.{k} changed")
        problems += [f"{name}.{k} added" for k in now if k not in attrs]
    return problems

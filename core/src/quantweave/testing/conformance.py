"""Conformance kit: declared capabilities must be what a quantizer really does.

For every capability a quantizer declares, the kit takes the *probe* model of the pattern
(:mod:`quantweave.vocabulary`: exported with default, non-strict ``torch.export`` once per
process and handed out as a copy, so checking many quantizers costs one export), runs the quantizer
(``transform_for_annotation`` + ``annotate``) and checks that:

* the pattern's anchor op is annotated, with the declared activation quantization
  (dtype, range, granularity, symmetry; ``is_dynamic`` for dynamic mode; no activation
  quantization for weight-only) and the declared weight quantization;
* the quantized model prepares (``prepare_qat_pt2e`` for QAT), runs, converts and runs;
  for a QAT conv + batch norm pattern, convert leaves no batch norm behind;
* nothing is annotated that the quantizer does not declare: every annotated node in every
  probe (declared or not) must be an op covered by a declared capability of that mode.

The kit also checks that the registry's declaration and each configured instance's
``quantization_capabilities()`` agree, and that a ``mode_options`` entry the factory
rejects is a reported failure (not a ``TypeError``).

Use from pytest (third-party plugins too)::

    from quantweave.testing.conformance import assert_plugin_conforms, capability_cases, check_capability
    import myplugin.plugin

    def test_my_plugin_conforms():  # every quantizer, with the patterns the plugin contributes
        assert_plugin_conforms(myplugin.plugin, name="myplugin")

    # or one test per capability:
    @pytest.mark.parametrize("cap", capability_cases(my_quantizer_info))
    def test_capability(cap):
        assert check_capability(my_quantizer_info, cap) == []
"""

from __future__ import annotations

import itertools
import operator
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.fx import GraphModule, Node

from .._modules.graph import get_attr_value
from .._modules.patterns import Chain, chain_of, matches, node_op
from .._modules.probing import activation_inputs, annotate_copy, bias_input, has_specs, output_found, weight_input
from .._modules.sharing import collect_specs, group_specs
from ..annotation import ANNOTATED_BY_KEY, is_annotated
from ..capabilities import Capability, Mode, Quant, TensorQuant, capability_sort_key, tensor_quant_from_spec
from ..compose import CapabilityRow, ComposableQuantizer, quantizer_label
from ..convert import convert_pt2e
from ..observers import is_fake_quant_module
from ..plugin_api import QuantizerInfo
from ..prepare import prepare_pt2e, prepare_qat_pt2e
from ..vocabulary import PROBES, PatternSpec, Vocabulary, core_vocabulary, export_probe, sweep_probe
from ..vocabulary.spec import ExportedProbe

__all__ = [
    "PROBES",
    "Vocabulary",
    "ConformanceFailure",
    "assert_conforms",
    "assert_plugin_conforms",
    "capability_cases",
    "check_capability",
    "check_composition",
    "check_conformance",
    "check_plugin",
]

#: Patterns a plugin contributes, by name (a :class:`~quantweave.vocabulary.Vocabulary` or a
#: plain mapping; see ``check_plugin``); the probes (:data:`PROBES`, :func:`sweep_probe`) and
#: :class:`~quantweave.vocabulary.Vocabulary` live in :mod:`quantweave.vocabulary` (re-exported).
Patterns = Mapping[str, PatternSpec]


@dataclass(frozen=True)
class ConformanceFailure:
    """One way a quantizer disagrees with its declaration."""

    plugin: str
    quantizer: str
    pattern: str
    mode: str
    message: str

    def __str__(self) -> str:
        who = f"{self.plugin}:{self.quantizer}" if self.plugin else self.quantizer
        return f"{who} [{self.pattern}, {self.mode}]: {self.message}"


def _annotated_nodes(gm: GraphModule) -> list[Node]:
    return [node for node in gm.graph.nodes if has_specs(node)]


def _vocabulary(patterns: Patterns | None) -> Vocabulary:
    return core_vocabulary().with_patterns(patterns)


def _export(pattern: str, mode: Mode, vocabulary: Vocabulary) -> ExportedProbe:
    """The probe of ``pattern`` exported for ``mode`` (exported once per process; a copy)."""
    return vocabulary.exported(pattern, mode is Mode.QAT)


def _annotate(quantizer: Any, exported: GraphModule) -> GraphModule:
    # a hosted (torchao) quantizer's annotations are translated, claims by its label
    return annotate_copy(quantizer, exported, quantizer_label(quantizer))


def _describe(tq: TensorQuant | None) -> str:
    return "not quantized" if tq is None else str(tq)


def _check_annotations(gm: GraphModule, cap: Capability, chain: Chain) -> list[str]:
    """Every stated field of ``cap`` against the annotations on the first occurrence of the
    pattern in the probe (problems name the node, the field, declared and found)."""
    occurrences = matches(gm.graph, chain)
    if not occurrences:
        return [f"the probe has no {' -> '.join('|'.join(sorted(s)) for s in chain)} after transform_for_annotation"]
    nodes = occurrences[0]
    anchor, last = nodes[0], nodes[-1]
    specs = collect_specs(gm.graph)
    roots, concrete = group_specs(specs)

    def resolved(key: Any) -> Any:
        return concrete[roots[key]] if key in specs else None

    if anchor not in _annotated_nodes(gm) and not any(n in _annotated_nodes(gm) for n in nodes):
        return [f"{anchor.name!r} ({anchor.target}) is not annotated"]
    problems = [
        f"{n.name!r} carries quantization specs but is not marked annotated (mark_annotated): a later quantizer "
        "would annotate it again"
        for n in nodes
        if n in _annotated_nodes(gm) and not is_annotated(n)
    ]
    want_dynamic = cap.mode is Mode.DYNAMIC
    inputs = activation_inputs(anchor)
    for producer in inputs:
        spec = resolved((producer, anchor))
        got = tensor_quant_from_spec(spec)
        if (cap.activation is None and got is not None) or (
            cap.activation is not None and not cap.activation.conforms(got)
        ):
            problems.append(
                f"activation input {producer.name!r} of {anchor.name!r}: declared {_describe(cap.activation)}, "
                f"annotated {_describe(got)}"
            )
        elif spec is not None and bool(getattr(spec, "is_dynamic", False)) != want_dynamic:
            problems.append(
                f"activation input {producer.name!r} of {anchor.name!r}: declared mode {cap.mode} but the spec has "
                f"is_dynamic={getattr(spec, 'is_dynamic', False)}"
            )
    weight = weight_input(anchor)
    if cap.weight is not None or weight is not None:
        got_w = tensor_quant_from_spec(resolved((weight, anchor))) if weight is not None else None
        if not ((cap.weight is None and got_w is None) or (cap.weight is not None and cap.weight.conforms(got_w))):
            problems.append(
                f"weight of {anchor.name!r}: declared {_describe(cap.weight)}, annotated {_describe(got_w)}"
            )
    if cap.bias is not None:
        bias = bias_input(anchor)
        if bias is None:
            problems.append(
                f"bias of {anchor.name!r}: declared {cap.bias}, but the probe's {anchor.name!r} has no bias"
            )
        else:
            got_b = tensor_quant_from_spec(resolved((bias, anchor)))
            ok = (
                got_b is None
                if cap.bias.kind == "float"
                else cap.bias.tensor is not None and cap.bias.tensor.conforms(got_b)
            )
            if not ok:
                problems.append(f"bias of {anchor.name!r}: declared {cap.bias}, annotated {_describe(got_b)}")
    found = output_found(last, anchor, inputs, specs, roots, resolved)
    if cap.output is not None and not _output_conforms(cap.output, found):
        problems.append(f"output of {last.name!r}: declared {cap.output}, annotated {found}")
    elif cap.mode in (Mode.DYNAMIC, Mode.WEIGHT_ONLY) and found.kind not in ("float", "shared"):
        problems.append(
            f"output of {last.name!r}: in mode {cap.mode} an output stays float (or carries its input's run-time "
            f"qparams); annotated {found}"
        )
    if cap.fused is not None and len(nodes) > 1:
        for a, b in itertools.pairwise(nodes):
            inside = a in specs or (a, b) in specs
            if cap.fused and inside:
                problems.append(
                    f"fusion: declared {' + '.join(n.name for n in nodes)} as one quantized unit, but the edge "
                    f"{a.name!r} -> {b.name!r} inside it is quantized"
                )
    return problems


def _output_conforms(declared: Quant, found: Quant) -> bool:
    if declared.kind != found.kind:
        return False
    if declared.kind == "quantized":
        assert declared.tensor is not None
        return declared.tensor.conforms(found.tensor)
    if declared.kind == "fixed":
        assert declared.tensor is not None and declared.scale is not None and found.scale is not None
        return (
            declared.tensor.conforms(found.tensor)
            and declared.zero_point == found.zero_point
            and abs(declared.scale - found.scale) <= 1e-9 * declared.scale
        )
    return declared == found


def _covered_nodes(gm: GraphModule, chains: list[Chain]) -> set[Node]:
    return {node for chain in chains for match in matches(gm.graph, chain) for node in match}


def _undeclared(gm: GraphModule, chains: list[Chain], mode: Mode) -> list[str]:
    covered = _covered_nodes(gm, chains)
    return [
        f"annotates {n.name!r} ({n.target}) in mode {mode}, but no declared pattern of that mode occurs there "
        "(a fused pattern covers its ops only where the whole pattern occurs)"
        for n in _annotated_nodes(gm)
        if n not in covered
    ]


def _run_flow(
    quantizer: Any,
    exported: GraphModule,
    inputs: tuple[torch.Tensor, ...],
    mode: Mode,
    folds_bn: bool = False,
    fused: tuple[str, ...] = (),
    grouped: tuple[str, TensorQuant] | None = None,
    tokenwise: str | None = None,
) -> list[str]:
    try:
        if mode is Mode.QAT:
            prepared = prepare_qat_pt2e(exported, quantizer)
            if not any(is_fake_quant_module(m) for m in prepared.modules()):
                return ["declared qat, but prepare_qat_pt2e inserted no fake-quantize modules"]
        else:
            prepared = prepare_pt2e(exported, quantizer)
        prepared(*inputs)
        converted = convert_pt2e(prepared)
        converted(*inputs)
    except Exception as exc:
        return [f"the quantized probe does not run end to end: {type(exc).__name__}: {exc}"]
    if folds_bn and any(node_op(n) == "aten.batch_norm.default" for n in converted.graph.nodes):
        return ["the batch norm of the quantized conv was not folded into it by convert_pt2e"]
    if grouped is not None:
        problems = _check_grouped_weight(converted, *grouped)
        if problems:
            return problems
    if tokenwise is not None:
        problems = _check_per_token_activation(converted, tokenwise)
        if problems:
            return problems
    by_name = {n.name: n for n in converted.graph.nodes}
    for a, b in itertools.pairwise(name for name in fused if name in by_name):
        if by_name[a] not in by_name[b].all_input_nodes:
            between = [str(n.target).split(".")[-2] for n in by_name[b].all_input_nodes if n.op == "call_function"]
            return [
                f"fusion: after convert_pt2e, {b!r} does not consume {a!r} directly (found {', '.join(between)} "
                "between them): the declared unit was split by quantize/dequantize"
            ]
    return []


def _check_grouped_weight(converted: GraphModule, anchor_name: str, declared: TensorQuant) -> list[str]:
    """A weight declared ``per_group`` is stored group-wise after ``convert_pt2e``: the anchor
    reads it through ``dequantize_per_channel_group`` with the declared group size, range and
    dtype, from a folded integer tensor whose values lie in the range, with one scale per row
    and group."""
    anchor = next((n for n in converted.graph.nodes if n.name == anchor_name), None)
    if anchor is None:
        return [f"grouped weight: {anchor_name!r} is not in the converted graph"]
    weight = weight_input(anchor)
    where = f"weight of {anchor_name!r} after convert_pt2e"
    if weight is None or node_op(weight) != "quantized_decomposed.dequantize_per_channel_group.default":
        found = "nothing" if weight is None else node_op(weight) if weight.op == "call_function" else weight.op
        return [f"{where}: declared {declared}, but it is not read through dequantize_per_channel_group ({found})"]
    stored, scales, _, qmin, qmax, dtype, group_size = weight.args[:7]
    problems = []
    if (qmin, qmax, group_size) != (declared.quant_min, declared.quant_max, declared.group_size):
        problems.append(
            f"{where}: declared range [{declared.quant_min}, {declared.quant_max}] in groups of {declared.group_size}; "
            f"dequantize_per_channel_group has [{qmin}, {qmax}] in groups of {group_size}"
        )
    if str(dtype).removeprefix("torch.") != declared.dtype:
        problems.append(f"{where}: declared dtype {declared.dtype}; dequantize_per_channel_group has {dtype}")
    if not isinstance(stored, Node) or stored.op != "get_attr" or not isinstance(scales, Node):
        return [*problems, f"{where}: the integer values are not a folded constant"]
    values = torch.as_tensor(get_attr_value(converted, str(stored.target)))
    scale_values = torch.as_tensor(get_attr_value(converted, str(scales.target)))
    if str(values.dtype).removeprefix("torch.") != declared.dtype:
        problems.append(f"{where}: stored as {values.dtype}, declared {declared.dtype}")
    elif values.numel() and not (declared.quant_min <= int(values.min()) and int(values.max()) <= declared.quant_max):
        problems.append(
            f"{where}: stored values span [{int(values.min())}, {int(values.max())}], outside the declared "
            f"[{declared.quant_min}, {declared.quant_max}]"
        )
    rows, columns = values.shape if values.dim() == 2 else (0, 0)
    if not columns or not isinstance(group_size, int) or scale_values.numel() != rows * (columns // group_size):
        problems.append(
            f"{where}: {tuple(scale_values.shape)} scales for a {tuple(values.shape)} weight in groups of {group_size}"
        )
    return problems


def _check_per_token_activation(converted: GraphModule, anchor_name: str) -> list[str]:
    """An activation declared ``per_token`` is quantized per token at run time after
    ``convert_pt2e``: the anchor reads it through ``dequantize_per_token``, whose scale and
    zero point come from ``choose_qparams_per_token_asymmetric`` of the same tensor."""
    anchor = next((n for n in converted.graph.nodes if n.name == anchor_name), None)
    if anchor is None:
        return [f"per-token activation: {anchor_name!r} is not in the converted graph"]
    where = f"activation input of {anchor_name!r} after convert_pt2e"
    index = 1 if node_op(anchor) == "aten.addmm.default" else 0  # addmm(bias, x, weight)
    dq = anchor.args[index] if len(anchor.args) > index and isinstance(anchor.args[index], Node) else None
    if dq is None or node_op(dq) != "quantized_decomposed.dequantize_per_token.default":
        found = "nothing" if dq is None else node_op(dq) if dq.op == "call_function" else dq.op
        return [f"{where}: declared per_token, but it is not read through dequantize_per_token ({found})"]
    q = dq.args[0]
    scale = dq.args[1]
    choose = scale.args[0] if isinstance(scale, Node) and scale.target is operator.getitem else None
    if not isinstance(q, Node) or node_op(q) != "quantized_decomposed.quantize_per_token.default":
        return [f"{where}: dequantize_per_token does not read a quantize_per_token"]
    if (
        not isinstance(choose, Node)
        or node_op(choose) != "quantized_decomposed.choose_qparams_per_token_asymmetric.default"
        or choose.args[0] is not q.args[0]
    ):
        return [
            f"{where}: its scale is not chosen per token (choose_qparams_per_token_asymmetric) from the same tensor"
        ]
    return []


def _build(info: QuantizerInfo, mode: Mode) -> Any:
    """``info.factory`` configured for ``mode``; a bad ``mode_options`` entry is named."""
    options = info.options_for(mode)
    try:
        return info.factory(**options)
    except Exception as exc:
        raise _BuildError(
            f"factory(**{options!r}) (mode_options for {mode.value!r}) raised {type(exc).__name__}: {exc}"
        ) from exc


class _BuildError(Exception):
    pass


def check_capability(
    info: QuantizerInfo, cap: Capability, plugin: str = "", patterns: Patterns | None = None
) -> list[ConformanceFailure]:
    """Check one declared capability of ``info``; returns the failures (empty: conforms).

    ``patterns``: patterns a plugin contributes (name -> PatternSpec), beyond the core vocabulary."""

    def fail(message: str) -> ConformanceFailure:
        return ConformanceFailure(plugin, info.name, cap.pattern, cap.mode.value, message)

    vocabulary = _vocabulary(patterns)
    if cap.pattern not in vocabulary:
        return [fail("the pattern is neither in the core vocabulary nor among the contributed patterns given")]
    if vocabulary[cap.pattern].probe is None:
        return [fail("the conformance kit has no probe for this pattern (a contributed PatternSpec needs one)")]
    if not cap.ops:
        cap = replace(cap, ops=vocabulary[cap.pattern].ops)
    try:
        quantizer = _build(info, cap.mode)
    except _BuildError as exc:
        return [fail(str(exc))]
    try:
        exported, inputs = _export(cap.pattern, cap.mode, vocabulary)
        annotated = _annotate(quantizer, exported)
    except Exception as exc:
        return [fail(f"annotating the probe raised {type(exc).__name__}: {exc}")]
    chain = chain_of(cap.ops)
    failures = [fail(p) for p in _check_annotations(annotated, cap, chain)]
    failures += [fail(p) for p in _undeclared(annotated, _chains(info, cap.mode, vocabulary), cap.mode)]
    if not failures:
        folds_bn = cap.mode is Mode.QAT and "aten.batch_norm.default" in cap.ops
        occurrence = matches(annotated.graph, chain)
        fused = tuple(n.name for n in occurrence[0]) if cap.fused and occurrence else ()
        grouped = (
            (occurrence[0][0].name, cap.weight)
            if cap.weight is not None and cap.weight.granularity == "per_group" and occurrence
            else None
        )
        tokenwise = (
            occurrence[0][0].name
            if cap.activation is not None and cap.activation.granularity == "per_token" and occurrence
            else None
        )
        failures += [
            fail(p) for p in _run_flow(quantizer, exported, inputs, cap.mode, folds_bn, fused, grouped, tokenwise)
        ]
    return failures


def _chains(info: QuantizerInfo, mode: Mode, vocabulary: Vocabulary) -> list[Chain]:
    """The op chains of every pattern ``info`` declares in ``mode``."""
    chains = []
    for c in info.capabilities:
        if c.mode is mode:
            ops = c.ops or (vocabulary[c.pattern].ops if c.pattern in vocabulary else ())
            if ops:
                chains.append(chain_of(ops))
    return chains


def _strip(cap: Capability) -> Capability:
    return replace(cap, plugin="", quantizer="")


def check_declaration_channels(info: QuantizerInfo, plugin: str = "") -> list[ConformanceFailure]:
    """The registry's declaration (``info.capabilities``) and each configured instance's
    ``quantization_capabilities()`` must agree, mode by mode."""
    failures: list[ConformanceFailure] = []
    for mode in sorted({c.mode for c in info.capabilities}, key=lambda m: m.value):
        try:
            quantizer = _build(info, mode)
            delivered_caps = list(quantizer.quantization_capabilities())
        except _BuildError as exc:
            failures.append(ConformanceFailure(plugin, info.name, "-", mode.value, str(exc)))
            continue
        except Exception as exc:
            message = f"quantization_capabilities() raised {type(exc).__name__}: {exc}"
            failures.append(ConformanceFailure(plugin, info.name, "-", mode.value, message))
            continue
        declared = {_strip(c) for c in info.capabilities if c.mode is mode}
        delivered = {_strip(c) for c in delivered_caps if isinstance(c, Capability) and c.mode is mode}
        mismatches = [
            (
                cap,
                "declared to the registry, but the instance's quantization_capabilities() does not return it (or "
                "returns it with other fields)",
            )
            for cap in declared - delivered
        ] + [
            (
                cap,
                "returned by the instance's quantization_capabilities() but not declared to the registry "
                f"(QuantizerInfo.capabilities): {cap.activation} / {cap.weight}",
            )
            for cap in delivered - declared
        ]
        for cap, message in sorted(mismatches, key=lambda item: capability_sort_key(item[0])):
            failures.append(ConformanceFailure(plugin, info.name, cap.pattern, mode.value, message))
    return failures


def check_conformance(
    info: QuantizerInfo, plugin: str = "", patterns: Patterns | None = None
) -> list[ConformanceFailure]:
    """Check every declared capability, that both declaration channels agree, and that
    undeclared patterns are left alone (every probe of the vocabulary is tried)."""
    failures: list[ConformanceFailure] = []
    if not info.capabilities:
        failures.append(ConformanceFailure(plugin, info.name, "-", "-", "declares no capabilities"))
    for cap in info.capabilities:
        failures += check_capability(info, cap, plugin, patterns)
    failures += check_declaration_channels(info, plugin)
    vocabulary = _vocabulary(patterns)
    declared = {c.key for c in info.capabilities}
    for mode in sorted({c.mode for c in info.capabilities}, key=lambda m: m.value):
        chains = _chains(info, mode, vocabulary)
        try:
            quantizer = _build(info, mode)
        except _BuildError:
            continue  # reported above
        probes = [vocabulary[p] for p in sorted(vocabulary) if (p, mode) not in declared]
        for spec in [*probes, PatternSpec("sweep", "the vocabulary sweep", ("aten.conv2d.default",), sweep_probe)]:
            if spec.probe is None:
                continue
            pattern = "<sweep>" if spec.probe is sweep_probe else spec.name
            try:
                annotated = _annotate(quantizer, export_probe(spec, mode is Mode.QAT).graph_module)
            except Exception as exc:
                failures.append(ConformanceFailure(plugin, info.name, pattern, mode.value, f"annotate raised {exc!r}"))
                continue
            for problem in _undeclared(annotated, chains, mode):
                failures.append(ConformanceFailure(plugin, info.name, pattern, mode.value, problem))
    return failures


def check_plugin(plugin: object, name: str = "plugin") -> list[ConformanceFailure]:
    """Load ``plugin`` (a plugin module or object, as its entry point names it) into a
    fresh plugin manager and check every quantizer it provides, with the patterns it
    contributes. A plugin that does not load is one failure saying why."""
    from ..registry import PluginManager

    manager = PluginManager(entry_points=[], strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record = manager.register(name, plugin)
    if record.status != "loaded":
        return [ConformanceFailure(name, "-", "-", "-", f"the plugin did not load ({record.status}): {record.error}")]
    contributed = {n: p for n, p in manager.patterns().items() if p.origin == name}
    failures: list[ConformanceFailure] = []
    for info in manager.quantizer_infos().values():
        failures += check_conformance(info, name, contributed)
    return failures


def assert_plugin_conforms(plugin: object, name: str = "plugin") -> None:
    """Raise ``AssertionError`` listing every failure of :func:`check_plugin`."""
    _raise_failures(check_plugin(plugin, name))


def check_composition(composed: ComposableQuantizer, patterns: Patterns | None = None) -> list[ConformanceFailure]:
    """Hold ``composed.capability_table()`` against what the members really annotate: for
    every row, the composed quantizer annotates the pattern's probe, and the member that
    claimed each op of the pattern must be the one the table names (``served_as``). A member
    that is itself a composition claims through its own members (their labels count as its)."""
    vocabulary = _vocabulary(patterns)
    claim_labels = _claim_labels(composed)
    failures: list[ConformanceFailure] = []
    for row in composed.capability_table(vocabulary):

        def fail(message: str, row: CapabilityRow = row) -> None:
            failures.append(ConformanceFailure("", composed.name, row.pattern, row.mode.value, message))

        spec = vocabulary.get(row.pattern)
        if spec is None or spec.probe is None:
            fail("no probe for this pattern: the row cannot be checked")
            continue
        try:
            annotated = _annotate(composed, vocabulary.exported(row.pattern, row.mode is Mode.QAT).graph_module)
        except Exception as exc:
            fail(f"annotating the probe raised {type(exc).__name__}: {exc}")
            continue
        occurrences = matches(annotated.graph, chain_of(row.capability.ops or spec.ops))
        if not occurrences:
            fail("the probe has no occurrence of the pattern after transform_for_annotation")
            continue
        nodes = occurrences[0]
        found = [node.meta.get(ANNOTATED_BY_KEY) if is_annotated(node) else None for node in nodes]
        expected = [None if step is None else step[0] for step in row.served_as]
        if len(found) != len(expected) or any(
            (who is None) != (label is None) or (label is not None and who not in claim_labels.get(label, {label}))
            for who, label in zip(found, expected, strict=False)
        ):
            claims = ", ".join(f"{n.name}: {who or 'nobody'}" for n, who in zip(nodes, found, strict=True))
            fail(f"the capability table says the ops are claimed by {expected}; on the probe: {claims}")
    return failures


def _claim_labels(composed: ComposableQuantizer) -> dict[str, set[str]]:
    """member label -> the labels its claims carry (``ANNOTATED_BY_KEY``): its own, and for a
    nested composition (which names its own members) its members', recursively."""
    out: dict[str, set[str]] = {}
    for label, member in zip(composed.labels, composed.quantizers, strict=True):
        names = {label}
        if isinstance(member, ComposableQuantizer):
            for inner in _claim_labels(member).values():
                names |= inner
        out[label] = names
    return out


def capability_cases(info: QuantizerInfo) -> list[Any]:
    """``pytest.param`` per declared capability, with readable ids, for parametrized tests."""
    import pytest

    return [pytest.param(cap, id=f"{info.name}-{cap.pattern}-{cap.mode.value}") for cap in info.capabilities]


def assert_conforms(info: QuantizerInfo, plugin: str = "", patterns: Patterns | None = None) -> None:
    """Raise ``AssertionError`` listing every failure of :func:`check_conformance`."""
    _raise_failures(check_conformance(info, plugin, patterns))


def _raise_failures(failures: list[ConformanceFailure]) -> None:
    if failures:
        raise AssertionError(f"{len(failures)} conformance failure(s):\n" + "\n".join(f"  - {f}" for f in failures))

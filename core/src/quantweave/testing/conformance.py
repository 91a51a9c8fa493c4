"""Conformance kit: declared capabilities must be what a quantizer really does.

For every capability a quantizer declares, the kit builds a *probe* model containing the
pattern, exports it with default (non-strict) ``torch.export``, runs the quantizer
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Node

from .._modules.foreign import translate_annotations
from .._modules.graph import copy_graph_module, get_attr_value
from .._modules.patterns import Chain, chain_of, matches, node_op
from .._modules.sharing import collect_specs, group_specs
from ..annotation import (
    ANNOTATED_BY_KEY,
    ANNOTATION_KEY,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    is_annotated,
)
from ..capabilities import (
    FLOAT,
    Capability,
    Mode,
    PatternSpec,
    Quant,
    TensorQuant,
    capability_sort_key,
    core_patterns,
    tensor_quant_from_spec,
)
from ..compose import CapabilityRow, ComposableQuantizer, quantizer_label
from ..convert import convert_pt2e
from ..observers import is_fake_quant_module
from ..plugin_api import QuantizerInfo
from ..prepare import prepare_pt2e, prepare_qat_pt2e

__all__ = [
    "PROBES",
    "ConformanceFailure",
    "assert_conforms",
    "assert_plugin_conforms",
    "capability_cases",
    "check_capability",
    "check_composition",
    "check_conformance",
    "check_plugin",
]

#: Extra vocabulary: patterns plugins contribute, by name (see ``check_plugin``).
Vocabulary = Mapping[str, PatternSpec]


class _Probe(nn.Module):
    def __init__(self, forward: Callable[..., torch.Tensor], **modules: nn.Module) -> None:
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)
        self._forward = forward

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self._forward(self, *inputs)


def _img(c: int = 3, s: int = 12) -> torch.Tensor:
    return torch.randn(1, c, s, s)


def _conv_then(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    return lambda: (_Probe(lambda m, x: fn(m.conv(x)), conv=nn.Conv2d(3, 8, 3)), (_img(),))


def _conv_bn_then(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    return lambda: (
        _Probe(lambda m, x: fn(m.bn(m.conv(x))), conv=nn.Conv2d(3, 8, 3), bn=nn.BatchNorm2d(8)),
        (_img(),),
    )


def _linear_then(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    return lambda: (_Probe(lambda m, x: fn(m.fc(x)), fc=nn.Linear(16, 8)), (torch.randn(2, 16),))


def _cat_then(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    return lambda: (
        _Probe(
            lambda m, x: fn(torch.cat([m.conv1(x), m.conv2(x)], 1)), conv1=nn.Conv2d(3, 4, 3), conv2=nn.Conv2d(3, 4, 3)
        ),
        (_img(),),
    )


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


ProbeFactory = Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]

#: pattern -> factory of (probe model, example inputs); one per vocabulary pattern.
PROBES: dict[str, ProbeFactory] = {
    "conv1d": lambda: (_Probe(lambda m, x: m.conv(x), conv=nn.Conv1d(4, 8, 3)), (torch.randn(1, 4, 16),)),
    "conv1d_relu": lambda: (_Probe(lambda m, x: F.relu(m.conv(x)), conv=nn.Conv1d(4, 8, 3)), (torch.randn(1, 4, 16),)),
    "conv2d": _conv_then(_identity),
    "conv2d_relu": _conv_then(F.relu),
    "conv2d_hardtanh": _conv_then(F.hardtanh),
    "conv2d_relu6": _conv_then(F.relu6),
    "conv2d_hardswish": _conv_then(F.hardswish),
    "conv2d_silu": _conv_then(F.silu),
    "conv2d_add": lambda: (
        _Probe(lambda m, x, y: m.conv(x) + y, conv=nn.Conv2d(3, 8, 3)),
        (_img(), torch.randn(1, 8, 10, 10)),
    ),
    "conv2d_add_relu": lambda: (
        _Probe(lambda m, x, y: F.relu(m.conv(x) + y), conv=nn.Conv2d(3, 8, 3)),
        (_img(), torch.randn(1, 8, 10, 10)),
    ),
    "conv2d_bn": _conv_bn_then(_identity),
    "conv2d_bn_relu": _conv_bn_then(F.relu),
    "conv2d_bn_hardtanh": _conv_bn_then(F.hardtanh),
    "conv2d_bn_relu6": _conv_bn_then(F.relu6),
    "conv2d_bn_hardswish": _conv_bn_then(F.hardswish),
    "conv2d_bn_silu": _conv_bn_then(F.silu),
    "conv2d_bn_add": lambda: (
        _Probe(lambda m, x, y: m.bn(m.conv(x)) + y, conv=nn.Conv2d(3, 8, 3), bn=nn.BatchNorm2d(8)),
        (_img(), torch.randn(1, 8, 10, 10)),
    ),
    "conv2d_bn_add_relu": lambda: (
        _Probe(lambda m, x, y: F.relu(m.bn(m.conv(x)) + y), conv=nn.Conv2d(3, 8, 3), bn=nn.BatchNorm2d(8)),
        (_img(), torch.randn(1, 8, 10, 10)),
    ),
    "conv_transpose2d": lambda: (_Probe(lambda m, x: m.conv(x), conv=nn.ConvTranspose2d(3, 8, 3)), (_img(),)),
    "conv_transpose2d_relu": lambda: (
        _Probe(lambda m, x: F.relu(m.conv(x)), conv=nn.ConvTranspose2d(3, 8, 3)),
        (_img(),),
    ),
    "conv_transpose2d_bn": lambda: (
        _Probe(lambda m, x: m.bn(m.conv(x)), conv=nn.ConvTranspose2d(3, 8, 3), bn=nn.BatchNorm2d(8)),
        (_img(),),
    ),
    "conv_transpose2d_bn_relu": lambda: (
        _Probe(lambda m, x: F.relu(m.bn(m.conv(x))), conv=nn.ConvTranspose2d(3, 8, 3), bn=nn.BatchNorm2d(8)),
        (_img(),),
    ),
    "linear": _linear_then(_identity),
    "linear_relu": _linear_then(F.relu),
    "linear_leaky_relu": _linear_then(F.leaky_relu),
    "linear_tanh": _linear_then(torch.tanh),
    "linear_gelu": _linear_then(F.gelu),
    "linear_add": lambda: (
        _Probe(lambda m, x, y: m.fc(x) + y, fc=nn.Linear(16, 8)),
        (torch.randn(2, 16), torch.randn(2, 8)),
    ),
    "linear_add_relu": lambda: (
        _Probe(lambda m, x, y: F.relu(m.fc(x) + y), fc=nn.Linear(16, 8)),
        (torch.randn(2, 16), torch.randn(2, 8)),
    ),
    "matmul": lambda: (_Probe(lambda m, x, y: torch.matmul(x, y)), (torch.randn(2, 4, 8), torch.randn(2, 8, 4))),
    "add": lambda: (_Probe(lambda m, x, y: x + y), (torch.randn(2, 8), torch.randn(2, 8))),
    "add_relu": lambda: (_Probe(lambda m, x, y: F.relu(x + y)), (torch.randn(2, 8), torch.randn(2, 8))),
    "mul": lambda: (_Probe(lambda m, x, y: x * y), (torch.randn(2, 8), torch.randn(2, 8))),
    "mul_relu": lambda: (_Probe(lambda m, x, y: F.relu(x * y)), (torch.randn(2, 8), torch.randn(2, 8))),
    # cat and flatten take quantized producers (and flatten a quantized consumer): backends
    # that only propagate quantization through these ops (x86) annotate them only then
    "cat": lambda: (
        _Probe(lambda m, x: torch.cat([m.conv1(x), m.conv2(x)], 1), conv1=nn.Conv2d(3, 4, 3), conv2=nn.Conv2d(3, 4, 3)),
        (_img(),),
    ),
    "max_pool2d": _conv_then(lambda t: F.max_pool2d(t, 2)),
    "avg_pool2d": _conv_then(lambda t: F.avg_pool2d(t, 2)),
    "adaptive_avg_pool2d": _conv_then(lambda t: F.adaptive_avg_pool2d(t, 1)),
    "flatten": lambda: (
        _Probe(lambda m, x: m.fc(torch.flatten(m.conv(x), 1)), conv=nn.Conv2d(3, 2, 3), fc=nn.Linear(200, 4)),
        (_img(),),
    ),
    # shape and reduction ops take a conv's output: backends annotate them to share their
    # input's qparams only when that input is quantized
    "mean": _conv_then(lambda t: t.mean((2, 3), keepdim=True)),
    "permute": _conv_then(lambda t: t.permute(0, 2, 3, 1)),
    "transpose": _conv_then(lambda t: t.transpose(1, 2)),
    "view": _conv_then(lambda t: t.view(1, -1)),
    "reshape": _conv_then(lambda t: t.reshape(1, -1)),
    "squeeze": _conv_then(lambda t: t.squeeze(0)),
    "slice": _conv_then(lambda t: t[:, :4]),
    "dropout": lambda: (
        _Probe(lambda m, x: m.drop(m.conv(x)), conv=nn.Conv2d(3, 8, 3), drop=nn.Dropout(0.25)),
        (_img(),),
    ),
    # activations on their own take a cat of two convs: quantized by any backend that
    # quantizes cat, fused into it by none (quantizers that quantize relu only after a
    # quantized producer, input_from "any", annotate them here)
    "relu": _cat_then(F.relu),
    "hardtanh": _cat_then(F.hardtanh),
    "relu6": _cat_then(F.relu6),
    "sigmoid": lambda: (_Probe(lambda m, x: torch.sigmoid(x)), (torch.randn(2, 8),)),
    "softmax": lambda: (_Probe(lambda m, x: torch.softmax(x, -1)), (torch.randn(2, 8),)),
    # rows of 128 split into the groups (32, 64, 128) group-wise embedding quantizers use
    "embedding": lambda: (_Probe(lambda m, t: m.emb(t), emb=nn.Embedding(16, 128)), (torch.tensor([[1, 2, 3]]),)),
}


class _Sweep(nn.Module):
    """Many vocabulary ops in one graph, so that what a quantizer annotates where ops meet
    (not only on one-pattern probes) is held against its declaration."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.bn = nn.BatchNorm2d(8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = F.relu(self.bn(self.conv1(x)))
        b = F.max_pool2d(a, 2)
        c = F.hardtanh(self.conv2(b)) + b
        d = torch.cat([F.relu6(self.conv3(c)), c * torch.sigmoid(c)], 1)
        e = F.adaptive_avg_pool2d(d[:, :8], 1).flatten(1)
        f = F.gelu(self.fc1(self.norm(e)))
        g = torch.softmax(self.fc2(f) + y, -1)
        h = F.avg_pool2d(self.up(b), 2).mean((2, 3)).reshape(1, -1).permute(1, 0)
        return g, torch.matmul(g.transpose(0, 1), g), h.view(-1), F.silu(c).squeeze(0)


def sweep_probe() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The vocabulary sweep model and its example inputs."""
    return _Sweep(), (torch.randn(1, 3, 12, 12), torch.randn(1, 8))


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


def _op_name(node: Node) -> str:
    """The vocabulary op of ``node``: an in-place op as its functional op, a conv with a
    string padding as the conv (see ``quantweave.capabilities.vocabulary_op``)."""
    return node_op(node)


def _annotated_nodes(gm: GraphModule) -> list[Node]:
    out = []
    for node in gm.graph.nodes:
        ann = node.meta.get(ANNOTATION_KEY)
        if isinstance(ann, QuantizationAnnotation) and (
            ann.output_qspec is not None or any(s is not None for s in ann.input_qspec_map.values())
        ):
            out.append(node)
    return out


def _vocabulary(patterns: Vocabulary | None) -> dict[str, PatternSpec]:
    return {**core_patterns(), **(patterns or {})}


def _export(
    pattern: str, mode: Mode, vocabulary: Mapping[str, PatternSpec]
) -> tuple[nn.Module, tuple[torch.Tensor, ...], GraphModule]:
    torch.manual_seed(0)
    probe = vocabulary[pattern].probe
    assert probe is not None
    model, inputs = probe()
    model.train(mode is Mode.QAT)
    return model, inputs, torch.export.export(model, inputs).module()


def _annotate(quantizer: Any, exported: GraphModule) -> GraphModule:
    gm, _ = copy_graph_module(exported)
    gm = quantizer.transform_for_annotation(gm)
    quantizer.annotate(gm)
    translate_annotations(gm.graph, lambda node: quantizer_label(quantizer))  # a hosted (torchao) quantizer's
    return gm


def _activation_inputs(node: Node) -> list[Node]:
    target = _op_name(node)
    if target == "aten.embedding.default":
        return []
    if target == "aten.cat.default":
        return [a for a in node.args[0] if isinstance(a, Node)]  # type: ignore[union-attr]
    if target in ("aten.add.Tensor", "aten.mul.Tensor", "aten.matmul.default"):
        return [a for a in node.args[:2] if isinstance(a, Node)]
    return [node.args[0]] if isinstance(node.args[0], Node) else []


def _weight_input(node: Node) -> Node | None:
    target = _op_name(node)
    index = 0 if target == "aten.embedding.default" else 1
    if target.startswith(("aten.conv", "aten.linear", "aten.embedding")) and len(node.args) > index:
        arg = node.args[index]
        return arg if isinstance(arg, Node) else None
    return None


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
    inputs = _activation_inputs(anchor)
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
    weight = _weight_input(anchor)
    if cap.weight is not None or weight is not None:
        got_w = tensor_quant_from_spec(resolved((weight, anchor))) if weight is not None else None
        if not ((cap.weight is None and got_w is None) or (cap.weight is not None and cap.weight.conforms(got_w))):
            problems.append(
                f"weight of {anchor.name!r}: declared {_describe(cap.weight)}, annotated {_describe(got_w)}"
            )
    if cap.bias is not None:
        bias = anchor.args[2] if len(anchor.args) > 2 and isinstance(anchor.args[2], Node) else None
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
    found = _output_found(last, anchor, inputs, specs, roots, resolved)
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


def _output_found(
    last: Node, anchor: Node, inputs: list[Node], specs: Mapping[Any, Any], roots: Mapping[Any, Any], resolved: Any
) -> Quant:
    """What the annotations do to the output of ``last``, as a :class:`Quant`."""
    spec = resolved(last)
    tensor = tensor_quant_from_spec(spec)
    if spec is None or tensor is None:
        return FLOAT
    for i, producer in enumerate(inputs):
        if (producer, anchor) in specs and roots[(producer, anchor)] == roots[last]:
            return Quant.shared(i)
    if isinstance(spec, FixedQParamsQuantizationSpec):
        return Quant.fixed(spec.scale, spec.zero_point, tensor)
    return Quant.quantized(tensor)


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
    if folds_bn and any(_op_name(n) == "aten.batch_norm.default" for n in converted.graph.nodes):
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
    weight = _weight_input(anchor)
    where = f"weight of {anchor_name!r} after convert_pt2e"
    if weight is None or _op_name(weight) != "quantized_decomposed.dequantize_per_channel_group.default":
        found = "nothing" if weight is None else _op_name(weight) if weight.op == "call_function" else weight.op
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
    dq = anchor.args[0] if anchor.args and isinstance(anchor.args[0], Node) else None
    if dq is None or _op_name(dq) != "quantized_decomposed.dequantize_per_token.default":
        found = "nothing" if dq is None else _op_name(dq) if dq.op == "call_function" else dq.op
        return [f"{where}: declared per_token, but it is not read through dequantize_per_token ({found})"]
    q = dq.args[0]
    scale = dq.args[1]
    choose = scale.args[0] if isinstance(scale, Node) and scale.target is operator.getitem else None
    if not isinstance(q, Node) or _op_name(q) != "quantized_decomposed.quantize_per_token.default":
        return [f"{where}: dequantize_per_token does not read a quantize_per_token"]
    if (
        not isinstance(choose, Node)
        or _op_name(choose) != "quantized_decomposed.choose_qparams_per_token_asymmetric.default"
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
    info: QuantizerInfo, cap: Capability, plugin: str = "", patterns: Vocabulary | None = None
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
        _, inputs, exported = _export(cap.pattern, cap.mode, vocabulary)
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


def _chains(info: QuantizerInfo, mode: Mode, vocabulary: Mapping[str, PatternSpec]) -> list[Chain]:
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
    info: QuantizerInfo, plugin: str = "", patterns: Vocabulary | None = None
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
        probes = [(p, vocabulary[p].probe) for p in sorted(vocabulary) if (p, mode) not in declared]
        for pattern, probe in [*probes, ("<sweep>", sweep_probe)]:
            if probe is None:
                continue
            try:
                torch.manual_seed(0)
                model, example = probe()
                model.train(mode is Mode.QAT)
                annotated = _annotate(quantizer, torch.export.export(model, example).module())
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


def check_composition(composed: ComposableQuantizer, patterns: Vocabulary | None = None) -> list[ConformanceFailure]:
    """Hold ``composed.capability_table()`` against what the members really annotate: for
    every row, the composed quantizer annotates the pattern's probe, and the member that
    claimed each op of the pattern must be the one the table names (``served_as``). A member
    that is itself a composition claims through its own members (their labels count as its)."""
    vocabulary = _vocabulary(patterns)
    claim_labels = _claim_labels(composed)
    failures: list[ConformanceFailure] = []
    for row in composed.capability_table():

        def fail(message: str, row: CapabilityRow = row) -> None:
            failures.append(ConformanceFailure("", composed.name, row.pattern, row.mode.value, message))

        spec = vocabulary.get(row.pattern)
        if spec is None or spec.probe is None:
            fail("no probe for this pattern: the row cannot be checked")
            continue
        try:
            torch.manual_seed(0)
            model, inputs = spec.probe()
            model.train(row.mode is Mode.QAT)
            annotated = _annotate(composed, torch.export.export(model, inputs).module())
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


def assert_conforms(info: QuantizerInfo, plugin: str = "", patterns: Vocabulary | None = None) -> None:
    """Raise ``AssertionError`` listing every failure of :func:`check_conformance`."""
    _raise_failures(check_conformance(info, plugin, patterns))


def _raise_failures(failures: list[ConformanceFailure]) -> None:
    if failures:
        raise AssertionError(f"{len(failures)} conformance failure(s):\n" + "\n".join(f"  - {f}" for f in failures))

"""The quantization flow the fuzz tests drive, and the checks they make on it.

Quantizers come from a fresh ``quantweave.testing.PluginManager()`` over what is installed (every
quantizer, in every mode it declares, with its ``mode_options``), plus option variants of
the first-party plugins and every ordered pair of installed quantizers composed with
``ComposableQuantizer``.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.capabilities import Capability, Mode, vocabulary_op
from quantweave.observers import ObserverBase
from quantweave.plugin_api import ANNOTATION_KEY
from quantweave.testing import PluginManager

# the exceptions quantweave documents (core/src/quantweave/errors.py)
DOCUMENTED_ERRORS: tuple[type[BaseException], ...] = (
    qw.AnnotationError,  # includes AnnotationConflictError and SharingError
    qw.ObserverNotCalibratedError,
    qw.ConvertError,
    qw.PluginError,
    qw.UnknownQuantizerError,
)

# option variants of the first-party plugins, beyond each mode's mode_options
VARIANTS: dict[str, tuple[tuple[Mode, dict[str, Any]], ...]] = {
    "x86": ((Mode.STATIC, {"enable_matmul": True}), (Mode.STATIC, {"reduce_range": True})),
    "xnnpack": (
        (Mode.STATIC, {"is_per_channel": True}),
        (Mode.STATIC, {"weight_qmin": -8, "weight_qmax": 7}),
    ),
}


@dataclass(frozen=True)
class QConfig:
    """One quantizer under test: its members (quantizer name, factory options), the mode."""

    members: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    mode: Mode

    @property
    def label(self) -> str:
        parts = []
        for name, options in self.members:
            opts = ",".join(f"{k}={v}" for k, v in options)
            parts.append(f"{name}({opts})" if opts else name)
        return "+".join(parts) + f"[{self.mode.value}]"

    def __str__(self) -> str:
        return self.label


@functools.cache
def manager() -> Any:
    """A fresh plugin manager over the installed plugins (loaded once per session)."""
    pm = PluginManager()
    failed = [r for r in pm.plugins() if r.status != "loaded"]
    assert not failed, f"installed plugins failed to load: {failed}"
    return pm


def _modes(info: Any) -> list[Mode]:
    return list(dict.fromkeys(cap.mode for cap in info.capabilities))


@functools.cache
def configs() -> tuple[QConfig, ...]:
    """Every installed quantizer in each declared post-training mode (static, dynamic,
    weight-only), the variants, and every ordered pair of installed quantizers that declare
    a static mode, composed (each with its static mode_options)."""
    pm = manager()
    infos = pm.quantizer_infos()
    out: list[QConfig] = []
    for qualified, info in infos.items():
        for mode in _modes(info):
            if mode is not Mode.QAT:  # static, dynamic, weight_only (QAT has its own test)
                out.append(QConfig(((qualified, tuple(sorted(info.options_for(mode).items()))),), mode))
        for mode, options in VARIANTS.get(info.name, ()):
            out.append(QConfig(((qualified, tuple(sorted(options.items()))),), mode))
    static = {q: tuple(sorted(info.options_for(Mode.STATIC).items())) for q, info in infos.items()}
    static = {q: options for q, options in static.items() if Mode.STATIC in _modes(infos[q])}
    for a, b in itertools.permutations(static, 2):
        out.append(QConfig(((a, static[a]), (b, static[b])), Mode.STATIC))
    return tuple(out)


@functools.cache
def qat_configs() -> tuple[QConfig, ...]:
    pm = manager()
    out = []
    for qualified, info in pm.quantizer_infos().items():
        if Mode.QAT in _modes(info):
            out.append(QConfig(((qualified, tuple(sorted(info.options_for(Mode.QAT).items()))),), Mode.QAT))
    return tuple(out)


def make_quantizer(config: QConfig) -> qw.Quantizer:
    pm = manager()
    members = [pm.get_quantizer(name, **dict(options)) for name, options in config.members]
    return members[0] if len(members) == 1 else qw.ComposableQuantizer(members)


# -- snapshots: the caller's model and inputs must come back as they were --------------------


@dataclass
class Snapshot:
    code: str
    state: dict[str, torch.Tensor]
    meta: list[dict[str, Any]]
    names: list[str]
    attrs: set[str]

    @classmethod
    def of(cls, gm: GraphModule) -> Snapshot:
        return cls(
            gm.code,
            {k: v.detach().clone() for k, v in gm.state_dict(keep_vars=True).items()},
            [dict(n.meta) for n in gm.graph.nodes],
            [n.name for n in gm.graph.nodes],
            set(dict(gm.named_modules())) | set(dict(gm.named_buffers())) | set(dict(gm.named_parameters())),
        )

    def differences(self, gm: GraphModule) -> list[str]:
        now = Snapshot.of(gm)
        out = []
        if now.code != self.code:
            out.append("graph code changed")
        if now.names != self.names:
            out.append("node list changed")
        if now.meta != self.meta:
            changed = [n for n, a, b in zip(self.names, self.meta, now.meta, strict=False) if a != b]
            out.append(f"node meta changed on {changed[:5]}")
        if now.attrs != self.attrs:
            out.append(f"attributes changed: {sorted(now.attrs ^ self.attrs)[:5]}")
        for name, value in self.state.items():
            if name not in now.state or not same_tensor(now.state[name], value):
                out.append(f"state {name!r} changed")
        return out


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and same_values(a, b)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit the same values (NaN equal to NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return bool(torch.equal(a, b))
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def clone_inputs(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(x.clone() for x in inputs)


def inputs_unchanged(before: tuple[torch.Tensor, ...], after: tuple[torch.Tensor, ...]) -> bool:
    return all(same_tensor(a, b) for a, b in zip(before, after, strict=True))


# -- outputs ---------------------------------------------------------------------------------


def flat_outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in flat_outputs(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in flat_outputs(item)]
    raise AssertionError(f"unexpected output type {type(out).__name__}")


def sqnr(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    reference, approximation = reference.detach().double(), approximation.detach().double()
    noise = (reference - approximation).pow(2).mean()
    signal = reference.pow(2).mean()
    if noise == 0:
        return float("inf")
    if signal == 0:
        return float("-inf")
    return float(10 * torch.log10(signal / noise))


# -- the flow --------------------------------------------------------------------------------


@dataclass
class Flow:
    config: QConfig
    quantizer: qw.Quantizer | None = None
    prepared: GraphModule | None = None
    converted: GraphModule | None = None
    error: BaseException | None = None
    stage: str = ""
    outputs: list[torch.Tensor] = field(default_factory=list)
    #: what convert_pt2e changed on the prepared model (it must change nothing)
    convert_changes: list[str] = field(default_factory=list)


def run_flow(
    exported: GraphModule,
    config: QConfig,
    calibration: Iterable[tuple[torch.Tensor, ...]],
    test_inputs: tuple[torch.Tensor, ...],
    qat: bool = False,
    backward: bool = True,
) -> Flow:
    """export → prepare → calibrate → convert → run; a raised exception is kept with the stage.

    ``qat``: prepare_qat_pt2e, and each calibration batch is a training step (forward, and
    backward unless ``backward=False``: a model whose float backward fails is not trainable)."""
    flow = Flow(config)
    try:
        flow.stage = "build"
        flow.quantizer = make_quantizer(config)
        flow.stage = "prepare"
        if qat:
            flow.prepared = qw.prepare_qat_pt2e(exported, flow.quantizer)
        else:
            flow.prepared = qw.prepare_pt2e(exported, flow.quantizer)
        flow.stage = "calibrate"
        if qat:  # training steps: forward and backward through the fake-quantizers
            for batch in calibration:
                loss = sum(t.float().sum() for t in flat_outputs(flow.prepared(*batch)) if t.is_floating_point())
                if backward and isinstance(loss, torch.Tensor) and loss.requires_grad:
                    loss.backward()
            qw.move_exported_model_to_eval(flow.prepared)
        else:
            with torch.no_grad():
                for batch in calibration:
                    flow.prepared(*batch)
        flow.stage = "convert"
        before = Snapshot.of(flow.prepared)
        flow.converted = qw.convert_pt2e(flow.prepared)
        flow.convert_changes = [
            f"convert_pt2e changed the prepared model: {d}" for d in before.differences(flow.prepared)
        ]
        flow.stage = "run"
        with torch.no_grad():
            flow.outputs = flat_outputs(flow.converted(*test_inputs))
    except Exception as exc:  # the property decides what is allowed
        flow.error = exc
    return flow


def trainable(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> bool:
    """True when a backward pass through (a copy of) the float model works: generated models
    may apply an in-place op to a tensor autograd saved, which no quantizer can fix."""
    import copy

    try:
        out = flat_outputs(copy.deepcopy(model).train()(*clone_inputs(inputs)))
        loss = sum(t.float().sum() for t in out if t.is_floating_point())
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.backward()
    except RuntimeError:
        return False
    return True


def node_names(gm: GraphModule) -> set[str]:
    return {n.name for n in gm.graph.nodes}


def names_something(message: str, names: Iterable[str]) -> bool:
    """True when the message quotes one of ``names`` (a node, observer, quantizer...)."""
    quoted = set(re.findall(r"'([^']+)'", message)) | set(re.findall(r'"([^"]+)"', message))
    return bool(quoted & set(names))


def count_observers(gm: GraphModule) -> int:
    return sum(1 for m in gm.modules() if isinstance(m, ObserverBase))


def annotated_nodes(gm: GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if n.meta.get(ANNOTATION_KEY) is not None]


def declared(quantizer: qw.Quantizer) -> list[Capability]:
    return list(quantizer.quantization_capabilities())


Check = Callable[[Flow], list[str]]


# -- what the report says, held against what the quantizers declare ---------------------------


def members(quantizer: qw.Quantizer) -> list[tuple[str, qw.Quantizer]]:
    """(label, quantizer) of every leaf member, as the composition labels them."""
    if isinstance(quantizer, qw.ComposableQuantizer):
        out = []
        for member, label in zip(quantizer.quantizers, quantizer.labels, strict=True):
            inner = members(member)
            out += inner if isinstance(member, qw.ComposableQuantizer) else [(label, member)]
        return out
    from quantweave.compose import quantizer_label

    return [(quantizer_label(quantizer), quantizer)]


def _is_observer(gm: GraphModule, node: Node) -> bool:
    if node.op != "call_module":
        return False
    try:
        return isinstance(gm.get_submodule(str(node.target)), (ObserverBase, torch.ao.quantization.FakeQuantizeBase))
    except AttributeError:
        return False


def _users(gm: GraphModule, node: Node) -> list[Node]:
    out: list[Node] = []
    for user in node.users:
        out += _users(gm, user) if _is_observer(gm, user) else [user]
    return out


def functional_name(op: str) -> str:
    """The op the pattern vocabulary knows ``op`` as (``quantweave.capabilities.vocabulary_op``):
    ``aten.relu_.default`` -> ``aten.relu.default``, ``aten.conv2d.padding`` ->
    ``aten.conv2d.default``; other names unchanged."""
    return vocabulary_op(op)


def occurrences(gm: GraphModule, ops: tuple[str, ...], functional: bool = False) -> list[tuple[Node, ...]]:
    """Occurrences of a pattern's op chain in a prepared graph, seen through observers
    (``functional``: a node matches as its vocabulary op, an in-place op as its functional
    op, a conv with a string padding as the conv)."""
    from quantweave._modules.patterns import chain_of

    chain = chain_of(ops)
    found: list[tuple[Node, ...]] = []

    def name(node: Node) -> str:
        return functional_name(str(node.target)) if functional else str(node.target)

    def extend(path: tuple[Node, ...]) -> None:
        if len(path) == len(chain):
            found.append(path)
            return
        for user in _users(gm, path[-1]):
            if user.op == "call_function" and name(user) in chain[len(path)]:
                extend((*path, user))

    for node in gm.graph.nodes:
        if node.op == "call_function" and name(node) in chain[0]:
            extend((node,))
    return found

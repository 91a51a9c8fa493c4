"""Capabilities derived by probing, for quantizers that declare none.

A quantizer *declares* its capabilities when its class defines ``quantization_capabilities``
(quantweave's base class returns none and does not count). For one that does not -- a
vendor's quantizer written against torchao's ``Quantizer``, or a quantweave quantizer that
never overrides the hook -- :func:`derive_capabilities` runs the conformance kit's probes
(one small model per vocabulary pattern, :data:`quantweave.vocabulary.PROBES`)
through its ``transform_for_annotation`` and ``annotate``, translates what it wrote
(torchao's annotation classes are read by their fields, as prepare does) and reads one
:class:`~quantweave.capabilities.Capability` off every probe whose whole pattern it
annotated: activation, weight and bias quantization, what happens to the output, whether
the ops are fused, and the mode (``dynamic`` from ``is_dynamic``, ``qat`` when the specs
build fake-quantize modules, ``weight_only`` when only the weight is quantized). Every
record has ``source="derived"``.

What a derived record can and cannot say:

* patterns probed behind a quantized conv (pooling, shape ops, cat, lone activations; see
  ``PatternSpec.producer`` in :mod:`quantweave.vocabulary`) are derived with ``input_from="any"``:
  the probe shows they are quantized after a quantized producer, not whether they would be
  without one;
* a quantizer configured for QAT is probed on models exported in training mode (the
  conv + batch-norm patterns appear only there); one configured otherwise on eval-mode
  exports;
* a pattern whose annotation the vocabulary cannot describe (a dtype it has no name for,
  such as 4-bit) is left out, and listed in :func:`probe_stats`;
* a pattern of several ops is derived only when they are fused (no quantize / dequantize
  between them): ops quantized one by one are what the single-op patterns say.

Cost: the probes are exported once per process, all in one graph (each probe a submodule on
its own inputs), shared by every quantizer probed; per quantizer, one copy of that graph, one
``transform_for_annotation`` + ``annotate`` call (some vendors' ``annotate`` costs seconds
per call whatever the graph's size), and reading. A quantizer that raises on the combined
graph is probed one probe at a time (:func:`exported_probe`), so one pattern it cannot take
costs only that pattern. Results are
cached per *configuration* (:func:`config_key`): two quantizers of the same class whose
attributes hold equal values (compared by a stable rendering: numbers, strings, dtypes,
enums, classes and functions by qualified name, ``functools.partial``, containers,
dataclasses and plain objects, recursively; a string embedding its owner's ``id`` or
``hash`` is a per-object name, not configuration) share one derivation; when a value has no
stable rendering (an object that shows only its address, a tensor, nesting deeper than 32),
the cache falls back to the quantizer object's identity.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import itertools
import threading
import time
import types
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

from ..annotation import ANNOTATION_KEY, FixedQParamsQuantizationSpec
from ..quantizer import Quantizer
from ..vocabulary import core_vocabulary, export_probe
from .patterns import chain_of, matches, node_op
from .probing import activation_inputs, annotate_copy, bias_input, has_specs, output_found, weight_input
from .records import FLOAT, Capability, Mode, Quant, TensorQuant, tensor_quant_from_spec
from .sharing import collect_specs, group_specs
from .torch_compat import unguarded_module

__all__ = [
    "ProbeStats",
    "capabilities_of",
    "config_key",
    "declares_capabilities",
    "derive_capabilities",
    "exported_probe",
    "probe_stats",
]

DERIVED = "derived"


def declares_capabilities(quantizer: object) -> bool:
    """True when ``quantizer``'s class defines ``quantization_capabilities`` itself (not
    quantweave's base default, which declares none)."""
    method = getattr(type(quantizer), "quantization_capabilities", None)
    return callable(method) and method is not Quantizer.quantization_capabilities


def capabilities_of(quantizer: object) -> list[Any]:
    """What ``quantizer`` declares, or, when it declares nothing, what probing derives."""
    if declares_capabilities(quantizer):
        return list(quantizer.quantization_capabilities())  # type: ignore[attr-defined]
    return list(derive_capabilities(quantizer))


# -- configuration keys -------------------------------------------------------------------------


class _Unstable(Exception):
    """A value with no rendering that is stable across equal configurations."""


_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.memory_format)


def _render(value: Any, depth: int, active: set[int]) -> str:
    if isinstance(value, _LEAVES):
        return repr(value)
    if isinstance(value, torch.qscheme):
        return str(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType)):
        return f"<{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}>"
    if isinstance(value, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return f"<op {value}>"
    if depth <= 0 or id(value) in active:
        raise _Unstable(type(value).__name__)
    active = active | {id(value)}
    if isinstance(value, functools.partial):
        args = [_render(a, depth - 1, active) for a in value.args]
        kwargs = [f"{k}={_render(v, depth - 1, active)}" for k, v in sorted(value.keywords.items())]
        return f"partial({_render(value.func, depth - 1, active)}, {', '.join(args + kwargs)})"
    if isinstance(value, types.MethodType):
        return f"method({_render(value.__self__, depth - 1, active)}.{value.__name__})"
    if isinstance(value, (list, tuple)):
        items = ", ".join(_render(v, depth - 1, active) for v in value)
        return f"{type(value).__name__}[{items}]"
    if isinstance(value, (set, frozenset)):
        return f"set[{', '.join(sorted(_render(v, depth - 1, active) for v in value))}]"
    if isinstance(value, Mapping):
        pairs = sorted(f"{_render(k, depth - 1, active)}: {_render(v, depth - 1, active)}" for k, v in value.items())
        return f"{{{', '.join(pairs)}}}"
    if isinstance(value, torch.Tensor):
        raise _Unstable("tensor")
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return f"{kind}({_render(fields, depth - 1, active)})"
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        return f"{kind}({_render(_without_identity(value, attrs), depth - 1, active)})"
    text = repr(value)
    if " at 0x" in text or " object at " in text:
        raise _Unstable(kind)
    return f"{kind}:{text}"


def _without_identity(owner: object, attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` with strings that embed the owner's own ``id`` or ``hash`` (a per-object key,
    such as NNCF's ``MMQ_<hash>``) replaced: they name the object, not its configuration."""
    marks = {str(id(owner))}
    with contextlib.suppress(TypeError):  # an unhashable owner has only its id
        marks.add(str(hash(owner)))
    return {k: "<identity>" if isinstance(v, str) and any(m in v for m in marks) else v for k, v in attrs.items()}


def config_key(quantizer: object) -> str | None:
    """A string equal for quantizers of one class configured alike (their attributes, rendered
    recursively); None when some attribute has no stable rendering (then only the object
    itself identifies its configuration)."""
    try:
        return _render(quantizer, 32, set())
    except _Unstable:
        return None
    except RecursionError:
        return None


# -- probes, exported once per process ----------------------------------------------------------

_LOCK = threading.RLock()
_PREFIX = "probe_"


def exported_probe(pattern: str, train: bool = False) -> tuple[GraphModule, tuple[Any, ...]]:
    """The core probe of ``pattern`` exported (``torch.export`` then ``.module()`` without
    the guard call), in training mode or not, and its inputs: exported once per process
    (:func:`quantweave.vocabulary.export_probe`), each call a copy of its own."""
    return tuple(core_vocabulary().exported(pattern, train))  # type: ignore[return-value]


class _AllProbes(torch.nn.Module):
    """Every probe as a submodule (``probe_<pattern>``) of one model, each on its own inputs:
    one export and one ``annotate`` call cover them all (a vendor's ``annotate`` may cost
    seconds per call whatever the graph's size)."""

    def __init__(self, probes: dict[str, tuple[torch.nn.Module, tuple[Any, ...]]]) -> None:
        super().__init__()
        self.counts: list[tuple[str, int]] = []
        for name, (model, inputs) in probes.items():
            self.add_module(_PREFIX + name, model)
            self.counts.append((name, len(inputs)))

    def forward(self, *flat: Any) -> tuple[Any, ...]:
        outputs, at = [], 0
        for name, count in self.counts:
            outputs.append(getattr(self, _PREFIX + name)(*flat[at : at + count]))
            at += count
        return tuple(outputs)


_COMBINED: dict[bool, tuple[GraphModule, dict[str, str]]] = {}


def _combined_probes(train: bool) -> tuple[GraphModule, dict[str, str]]:
    """All probes exported as one graph (once per process per mode), and placeholder name ->
    the pattern whose probe it feeds."""
    with _LOCK:
        if train not in _COMBINED:
            probes = {}
            for name, spec in core_vocabulary().items():
                if spec.probe is None or (not train and any("batch_norm" in op for op in spec.ops)):
                    continue  # conv + batch norm patterns are QAT patterns: probed in training mode only
                torch.manual_seed(0)
                model, inputs = spec.probe()
                model.train(train)
                probes[name] = (model, tuple(inputs))
            combined = _AllProbes(probes).train(train)
            flat = tuple(x for _, inputs in probes.values() for x in inputs)
            gm = unguarded_module(torch.export.export(combined, flat))
            owners = [name for name, (_, inputs) in probes.items() for _ in inputs]
            placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
            _COMBINED[train] = (gm, dict(zip(placeholders, owners, strict=False)))
        return _COMBINED[train]


def _probe_of(node: Node, placeholders: Mapping[str, str], memo: dict[Node, str | None]) -> str | None:
    """The pattern whose probe ``node`` belongs to: by its module stack, its parameter's
    path, its placeholder, or else its first input that has one."""
    if node in memo:
        return memo[node]
    memo[node] = None  # cycles cannot occur in an FX graph; this only guards re-entry
    found: str | None = None
    stack = node.meta.get("nn_module_stack") or {}
    for path, _ in reversed(list(stack.values())):
        head = str(path).split(".")[0]
        if head.startswith(_PREFIX):
            found = head.removeprefix(_PREFIX)
            break
    if found is None and node.op == "get_attr" and str(node.target).startswith(_PREFIX):
        found = str(node.target).split(".")[0].removeprefix(_PREFIX)
    if found is None and node.op == "placeholder":
        found = placeholders.get(node.name)
    if found is None:
        for source in node.all_input_nodes:
            found = _probe_of(source, placeholders, memo)
            if found is not None:
                break
    memo[node] = found
    return found


# -- statistics ---------------------------------------------------------------------------------


@dataclass
class ProbeStats:
    """One derivation: its wall time (seconds, exporting probes excluded), the probes tried,
    and the patterns left out with why (a probe that raised, or an annotation the vocabulary
    cannot describe)."""

    seconds: float = 0.0
    export_seconds: float = 0.0
    probes: int = 0
    derived: int = 0
    left_out: dict[str, str] = field(default_factory=dict)


_BY_KEY: dict[str, tuple[tuple[Capability, ...], ProbeStats]] = {}
_BY_OBJECT: weakref.WeakKeyDictionary[Any, tuple[tuple[Capability, ...], ProbeStats]] = weakref.WeakKeyDictionary()
_BY_ID: dict[int, tuple[Any, tuple[tuple[Capability, ...], ProbeStats]]] = {}


def _cached(quantizer: object, key: str | None) -> tuple[tuple[Capability, ...], ProbeStats] | None:
    """By the object first (a vendor may change its own attributes while annotating, which
    changes its key), then by its configuration key."""
    try:
        found = _BY_OBJECT.get(quantizer)
    except TypeError:  # neither hashable nor weak-referenceable
        entry = _BY_ID.get(id(quantizer))
        found = entry[1] if entry is not None and entry[0] is quantizer else None
    if found is None and key is not None:
        found = _BY_KEY.get(key)
    return found


def _store(quantizer: object, key: str | None, result: tuple[tuple[Capability, ...], ProbeStats]) -> None:
    if key is not None:
        _BY_KEY[key] = result
    try:
        _BY_OBJECT[quantizer] = result
    except TypeError:  # kept alive with its result, so its id stays its own
        _BY_ID[id(quantizer)] = (quantizer, result)


def probe_stats(quantizer: object) -> ProbeStats | None:
    """The statistics of ``quantizer``'s derivation (None if it was never derived)."""
    entry = _cached(quantizer, config_key(quantizer))
    return None if entry is None else entry[1]


def clear_cache() -> None:
    """Forget every derivation (the exported probes are kept)."""
    with _LOCK:
        _BY_KEY.clear()
        _BY_OBJECT.clear()
        _BY_ID.clear()


# -- derivation ---------------------------------------------------------------------------------


def derive_capabilities(quantizer: object) -> tuple[Capability, ...]:
    """The capabilities probing ``quantizer`` shows (see the module docstring), cached per
    configuration. A probe the quantizer raises on is left out (see :func:`probe_stats`)."""
    key = config_key(quantizer)
    with _LOCK:
        cached = _cached(quantizer, key)
        if cached is not None:
            return cached[0]
        stats = ProbeStats()
        start = time.perf_counter()
        caps = _derive(quantizer, False, stats)
        if any(c.mode is Mode.QAT for c in caps):  # a QAT configuration: probe the training-mode exports
            stats = ProbeStats()
            start = time.perf_counter()
            caps = _derive(quantizer, True, stats)
        stats.seconds = time.perf_counter() - start - stats.export_seconds
        stats.derived = len(caps)
        result = (tuple(caps), stats)
        _store(quantizer, key, result)
        return result[0]


def _derive(quantizer: object, train: bool, stats: ProbeStats) -> list[Capability]:
    """Annotate all probes as one graph (one call of the quantizer's hooks); if the quantizer
    raises on it, probe by probe (one failing probe then costs only its own pattern)."""
    vocabulary = {
        name: spec
        for name, spec in core_vocabulary().items()
        if spec.probe is not None and (train or not any("batch_norm" in op for op in spec.ops))
    }
    stats.probes = len(vocabulary)
    fresh = train not in _COMBINED
    before = time.perf_counter()
    combined, placeholders = _combined_probes(train)
    if fresh:
        stats.export_seconds += time.perf_counter() - before
    try:
        gm = _annotate(quantizer, combined)
    except Exception as exc:
        stats.left_out["<all probes in one graph>"] = f"annotate raised {type(exc).__name__}: {exc}; probed one by one"
        return _derive_one_by_one(quantizer, train, stats, vocabulary)
    memo: dict[Node, str | None] = {}
    caps: list[Capability] = []

    def in_probe(pattern: str) -> Callable[[Node], bool]:
        return lambda node: _probe_of(node, placeholders, memo) == pattern

    for name, spec in vocabulary.items():
        try:
            cap = _read(gm, name, spec.ops, in_probe(name))
        except ValueError as exc:  # an annotation a Capability cannot state
            stats.left_out[name] = str(exc)
            continue
        if cap is not None:
            caps.append(cap)
    return caps


def _derive_one_by_one(
    quantizer: object, train: bool, stats: ProbeStats, vocabulary: Mapping[str, Any]
) -> list[Capability]:
    caps: list[Capability] = []
    for name, spec in vocabulary.items():
        before = time.perf_counter()
        exported, _ = export_probe(spec, train)  # exported once per process; a copy of its own
        stats.export_seconds += time.perf_counter() - before
        try:
            gm = _annotate(quantizer, exported)
            cap = _read(gm, name, spec.ops)
        except ValueError as exc:
            stats.left_out[name] = str(exc)
            continue
        except Exception as exc:
            stats.left_out[name] = f"annotating the probe raised {type(exc).__name__}: {exc}"
            continue
        if cap is not None:
            caps.append(cap)
    return caps


def _annotate(quantizer: Any, exported: GraphModule) -> GraphModule:
    """A copy of ``exported`` annotated by ``quantizer`` (its warnings silenced), torchao's
    annotation classes translated to quantweave's, as prepare does."""
    label = getattr(quantizer, "name", None) or type(quantizer).__name__
    return annotate_copy(quantizer, exported, str(label), quiet=True)


def _is_fake_quantize(spec: Any) -> bool:
    ctr = getattr(spec, "observer_or_fake_quant_ctr", None)
    if not callable(ctr):
        return False
    try:
        module = ctr()
    except Exception:
        return False
    return hasattr(module, "fake_quant_enabled") or isinstance(
        getattr(module, "activation_post_process", None), torch.nn.Module
    )


def _read(
    gm: GraphModule, pattern: str, ops: tuple[str, ...], in_probe: Callable[[Node], bool] | None = None
) -> Capability | None:
    """The capability the annotations on the probe of ``pattern`` show (None: not supported);
    ``in_probe`` tells the nodes of that probe when ``gm`` holds several."""
    occurrences = [m for m in matches(gm.graph, chain_of(ops)) if in_probe is None or in_probe(m[0])]
    if not occurrences:
        return None
    nodes = occurrences[0]
    anchor, last = nodes[0], nodes[-1]
    if not has_specs(anchor) or not all(n.meta.get(ANNOTATION_KEY) is not None for n in nodes):
        return None
    specs = collect_specs(gm.graph)
    roots, concrete = group_specs(specs)

    def resolved(key: Any) -> Any:
        return concrete[roots[key]] if key in specs else None

    inputs = activation_inputs(anchor)
    # what the anchor reads: its input edge's spec, or else its producer's output spec (some
    # vendors, OpenVINO's, quantize a tensor where it is produced, for every reader)
    read = [resolved((p, anchor)) if (p, anchor) in specs else resolved(p) for p in inputs]
    act_spec = next((spec for spec in read if spec is not None), None)
    weight = weight_input(anchor)
    weight_spec = resolved((weight, anchor)) if weight is not None else None
    if act_spec is None and weight_spec is None:
        return None
    activation = _describe(act_spec, "activation", anchor)
    weight_q = _describe(weight_spec, "weight", anchor)
    if act_spec is None:
        mode = Mode.WEIGHT_ONLY
    elif getattr(act_spec, "is_dynamic", False):
        mode = Mode.DYNAMIC
    elif _is_fake_quantize(act_spec):
        mode = Mode.QAT
    else:
        mode = Mode.STATIC
    bias: Quant | None = None
    bias_node = bias_input(anchor)
    if bias_node is not None and weight is not None:
        bias_spec = resolved((bias_node, anchor))
        bias_tq = tensor_quant_from_spec(bias_spec)
        bias = FLOAT if bias_spec is None else Quant.quantized(bias_tq) if bias_tq is not None else None
    output: Quant | None = output_found(last, anchor, inputs, specs, roots, resolved)
    if isinstance(resolved(last), FixedQParamsQuantizationSpec) and output is not None and output.kind != "fixed":
        output = None
    if mode in (Mode.DYNAMIC, Mode.WEIGHT_ONLY) and output is not None and output.kind not in ("float", "shared"):
        output = None
    fused = None
    if len(nodes) > 1:
        fused = not any(a in specs or (a, b) in specs for a, b in itertools.pairwise(nodes))
        if not fused:  # each op quantized on its own: that is the single-op patterns, not this one
            return None
    return Capability(
        pattern,
        mode,
        activation if mode is not Mode.WEIGHT_ONLY else None,
        weight_q,
        notes=f"derived by probing ({', '.join(node_op(n) for n in nodes)})",
        output=output,
        bias=bias,
        fused=fused,
        input_from="any" if core_vocabulary()[pattern].producer else None,
        source=DERIVED,
    )


def _describe(spec: Any, what: str, anchor: Node) -> TensorQuant | None:
    if spec is None:
        return None
    tq = tensor_quant_from_spec(spec)
    if tq is None:
        raise ValueError(
            f"the {what} of {anchor.name!r} is quantized with {getattr(spec, 'dtype', '?')}, which the capability "
            "vocabulary has no name for"
        )
    return tq


def derived_for_info(info: Any) -> tuple[Capability, ...]:
    """Derived capabilities of a registered quantizer that declares none: its factory built
    with no options (the static configuration) and with each ``mode_options`` entry; a build
    or derivation that raises is warned about and contributes nothing."""
    configurations: list[dict[str, Any]] = [{}]
    configurations += [dict(options) for options in info.mode_options.values() if dict(options)]
    caps: dict[tuple[str, Mode], Capability] = {}
    for options in configurations:
        try:
            quantizer = info.factory(**options)
            if declares_capabilities(quantizer):
                found = [c for c in quantizer.quantization_capabilities() if isinstance(c, Capability)]
            else:
                found = list(derive_capabilities(quantizer))
        except Exception as exc:
            warnings.warn(
                f"quantizer {info.name!r}: deriving capabilities with options {options!r} failed: "
                f"{type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        for cap in found:
            caps.setdefault(cap.key, cap)
    return tuple(caps.values())

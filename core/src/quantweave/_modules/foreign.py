"""Hosting quantizers written against torchao's (or torch.ao's) PT2E API.

A quantizer written for ``torchao.quantization.pt2e.quantizer`` (every vendor quantizer
published today: ExecuTorch's XNNPACK, Arm, Qualcomm, ...) writes torchao's
``QuantizationAnnotation`` and specs into ``node.meta["quantization_annotation"]``, and
its specs build torchao's observers. quantweave never imports torchao: it recognises those
objects by their fields (duck typing, the class name along the MRO plus the attributes
PT2E defines), and :func:`translate_annotations` replaces them by quantweave's own,
once, right after the quantizer's ``annotate`` and ``validate`` (so the quantizer itself
reads and writes its own classes throughout, as under torchao). The observers its specs
build stay the vendor's: convert recognises them by protocol
(:func:`quantweave.observers.is_observer_module`), and :func:`check_observers` rejects at
prepare, naming the edge and the quantizer, an observer convert could not turn into
quantize/dequantize ops.

Where a vendor's spec is valid under torchao but quantweave's spec constructors would
refuse it, the translation says what torchao does with it:

* a float32 ``QuantizationSpec`` (e.g. a bias kept float with a ``PlaceholderObserver``)
  is a float tensor left float: torchao inserts an observer and convert removes it; it
  becomes ``None`` (so does a shared spec whose group is float);
* a per-channel spec with ``ch_axis=None`` takes the ``ch_axis`` its observer is built with
  (the ``with_args`` keyword, else the constructor's default);
* torch's quantized dtypes (``torch.qint8``, ``torch.quint8``, ``torch.qint32``) become the
  integer dtypes they stand for.

Input-map entries naming a node of the graph that is not an input of the annotated node
(torchao ignores them: there is no such edge to observe):

* with a ``None`` spec (nothing asked for) they are dropped, for every quantizer;
* with a spec, in an annotation of torchao's / torch.ao's classes, they are dropped as
  torchao drops them (the hosted quantizer was written and tested against that), unless a
  shared or derived spec refers to that edge: then, as under torchao, the edge's spec
  takes part in the sharing groups (implicit sharing included) and its group's observer
  observes the referring edges / nodes, never the edge itself (Samsung's quantizer shares
  a reshape's output with such an edge);
* with a spec, in a quantweave annotation, prepare raises an
  :class:`~quantweave.errors.AnnotationError` naming the quantizer, the node and the entry
  (a quantweave quantizer's author can fix it; it is often an annotation of another graph).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Graph, Node

from ..annotation import (
    ANNOTATION_KEY,
    DerivedQuantizationSpec,
    EdgeOrNode,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    QuantizationSpecBase,
    SharedQuantizationSpec,
)
from ..errors import AnnotationError, SharingError
from .qtypes import integer_dtype, is_integer_dtype, is_per_channel

__all__ = [
    "PT2E_HOOKS",
    "check_observers",
    "convertible",
    "is_annotation_like",
    "is_pt2e_quantizer",
    "translate_annotations",
]

_ANNOTATION_FIELDS = ("input_qspec_map", "output_qspec")
#: PT2E spec class name -> the attributes that class defines (all read by the translation)
_SPEC_FIELDS: dict[str, tuple[str, ...]] = {
    "QuantizationSpec": ("dtype", "observer_or_fake_quant_ctr"),
    "FixedQParamsQuantizationSpec": ("dtype", "scale", "zero_point"),
    "SharedQuantizationSpec": ("edge_or_node",),
    "DerivedQuantizationSpec": ("derived_from", "derive_qparams_fn", "dtype"),
}
_FLOAT = object()  # marks a spec translated to "left float" (None)
_OUTPUT = object()  # _Translator.spec: the spec is a node's output spec


#: the hooks prepare calls: an object with all of them works wherever a quantweave.Quantizer does
PT2E_HOOKS = ("transform_for_annotation", "annotate", "validate", "prepare_obs_or_fq_callback")


def is_pt2e_quantizer(obj: object) -> bool:
    """True for an object with PT2E's quantizer hooks (torchao's ``Quantizer`` and its
    subclasses, any vendor's), whatever its class."""
    return all(callable(getattr(obj, hook, None)) for hook in PT2E_HOOKS)


def _pt2e_kind(obj: object, names: Any) -> str | None:
    """The PT2E class ``obj`` is an instance of, by name along its MRO (``None`` if none)."""
    for cls in type(obj).__mro__:
        if cls.__name__ in names:
            return cls.__name__
    return None


def is_annotation_like(obj: object) -> bool:
    """True for quantweave's QuantizationAnnotation and any object with PT2E's annotation
    fields (torchao's, torch.ao's)."""
    if isinstance(obj, QuantizationAnnotation):
        return True
    return _pt2e_kind(obj, ("QuantizationAnnotation",)) is not None and all(
        hasattr(obj, name) for name in _ANNOTATION_FIELDS
    )


def _origin(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


class _Translator:
    def __init__(self, graph: Graph, label: Callable[[Node], str]) -> None:
        self.graph = graph
        self.label = label
        self.memo: dict[int, Any] = {}
        self.keep: list[Any] = []  # keeps translated objects alive, so ids in memo stay unique

    def spec(self, spec: Any, node: Node, producer: Any = _OUTPUT) -> Any:
        """quantweave's spec for ``spec`` (or _FLOAT: a float spec, left float), on the edge
        ``producer -> node`` or (no ``producer``) the output of ``node``."""
        if spec is None or isinstance(spec, QuantizationSpecBase):
            return spec
        if id(spec) in self.memo:
            return self.memo[id(spec)]
        if producer is _OUTPUT:
            where = f"output of {node.name!r}"
        else:
            where = f"edge {getattr(producer, 'name', producer)!r} -> {node.name!r}"
        kind = _pt2e_kind(spec, _SPEC_FIELDS)
        if kind is None or not all(hasattr(spec, f) for f in _SPEC_FIELDS[kind]):
            raise AnnotationError(
                f"{where}: expected a QuantizationSpecBase (QuantizationSpec, FixedQParamsQuantizationSpec, "
                "SharedQuantizationSpec or DerivedQuantizationSpec: quantweave's, or with the fields of torchao's / "
                f"torch.ao's); got {type(spec).__name__} ({_origin(spec)}, from quantizer {self.label(node)!r})"
            )
        try:
            translated = getattr(self, f"_{kind}")(spec)
        except ValueError as exc:
            raise AnnotationError(
                f"{where}: quantizer {self.label(node)!r} annotated it with {_origin(spec)} {spec!r}, which quantweave "
                f"cannot take: {exc}"
            ) from exc
        self.memo[id(spec)] = translated
        self.keep.append(spec)
        return translated

    @staticmethod
    def _dtype(dtype: Any) -> Any:
        return integer_dtype(dtype) if is_integer_dtype(integer_dtype(dtype)) else dtype

    def _QuantizationSpec(self, spec: Any) -> Any:
        dtype = self._dtype(spec.dtype)
        if dtype == torch.float32 or dtype == torch.float:
            return _FLOAT  # torchao observes it with a float observer that convert removes
        # float16 / bfloat16 placeholders and float8 specs go to quantweave's QuantizationSpec,
        # which takes them as torchao does (and refuses any other dtype, naming it)
        qscheme = getattr(spec, "qscheme", None)
        ch_axis = getattr(spec, "ch_axis", None)
        if is_per_channel(qscheme) and ch_axis is None:
            ch_axis = _ctr_default(spec.observer_or_fake_quant_ctr, "ch_axis")
        return QuantizationSpec(
            dtype=dtype,
            observer_or_fake_quant_ctr=spec.observer_or_fake_quant_ctr,
            quant_min=getattr(spec, "quant_min", None),
            quant_max=getattr(spec, "quant_max", None),
            qscheme=qscheme,
            ch_axis=ch_axis,
            is_dynamic=bool(getattr(spec, "is_dynamic", False)),
        )

    def _FixedQParamsQuantizationSpec(self, spec: Any) -> Any:
        return FixedQParamsQuantizationSpec(
            dtype=self._dtype(spec.dtype),
            scale=_number(spec.scale, float, "scale"),
            zero_point=_number(spec.zero_point, int, "zero_point"),
            quant_min=getattr(spec, "quant_min", None),
            quant_max=getattr(spec, "quant_max", None),
            qscheme=getattr(spec, "qscheme", None),
            is_dynamic=bool(getattr(spec, "is_dynamic", False)),
        )

    def _SharedQuantizationSpec(self, spec: Any) -> Any:
        target = spec.edge_or_node
        if isinstance(target, list):
            target = tuple(target)
        return SharedQuantizationSpec(target)

    def _DerivedQuantizationSpec(self, spec: Any) -> Any:
        return DerivedQuantizationSpec(
            derived_from=[tuple(k) if isinstance(k, list) else k for k in spec.derived_from],
            derive_qparams_fn=spec.derive_qparams_fn,
            dtype=self._dtype(spec.dtype),
            quant_min=getattr(spec, "quant_min", None),
            quant_max=getattr(spec, "quant_max", None),
            qscheme=getattr(spec, "qscheme", None),
            ch_axis=getattr(spec, "ch_axis", None),
            is_dynamic=bool(getattr(spec, "is_dynamic", False)),
        )


def _number(value: Any, kind: type, name: str) -> Any:
    """A Python float / int from a number or one-element tensor (torchao takes either)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number; got {value!r}")
    if kind is int:
        if float(value) != int(value):
            raise ValueError(f"{name} must be an integer; got {value!r}")
        return int(value)
    return float(value)


def _ctr_default(ctr: Any, name: str) -> Any:
    """The value of keyword ``name`` an observer constructor (class or ``with_args``
    partial) builds with: the partial's keyword, else the class's default."""
    seen = 0
    while seen < 8:  # a with_args partial wraps functools.partial objects: unwrap a few levels
        partial = getattr(ctr, "p", None)
        if partial is not None:
            ctr = partial
        keywords = getattr(ctr, "keywords", None)
        if isinstance(keywords, dict) and name in keywords:
            return keywords[name]
        inner = getattr(ctr, "func", None)
        if inner is None:
            break
        ctr = inner
        seen += 1
    try:
        parameter = inspect.signature(ctr).parameters.get(name)
    except (TypeError, ValueError):
        parameter = None
    if parameter is None or parameter.default is inspect.Parameter.empty:
        raise ValueError(f"qscheme is per-channel and ch_axis is None; its observer {ctr!r} has no {name} default")
    return parameter.default


def translate_annotations(graph: Graph, label: Callable[[Node], str]) -> int:
    """Replace every torchao / torch.ao annotation and spec on ``graph`` by quantweave's,
    and drop lenient input-map entries (see the module docstring). ``label(node)`` names
    the quantizer that annotated ``node``. Returns how many annotations were replaced."""
    translator = _Translator(graph, label)
    replaced = 0
    hosted: set[Node] = set()
    annotated: list[tuple[Node, QuantizationAnnotation]] = []  # every annotation, as it is after translation
    for node in graph.nodes:
        annotation = node.meta.get(ANNOTATION_KEY)
        if annotation is None:
            continue
        native = isinstance(annotation, QuantizationAnnotation)
        if native and _native_specs(annotation):
            annotated.append((node, annotation))  # nothing to translate
            continue
        if not native and not is_annotation_like(annotation):
            raise AnnotationError(
                f"node {node.name!r}: meta[{ANNOTATION_KEY!r}] must be a QuantizationAnnotation; got "
                f"{type(annotation).__name__} ({_origin(annotation)}, from quantizer {label(node)!r}); quantweave's "
                "or one with the fields of torchao's / torch.ao's (input_qspec_map, output_qspec, "
                "allow_implicit_sharing, _annotated)"
            )
        input_map: dict[Any, Any] = {}
        changed = not native
        raw_map = getattr(annotation, "input_qspec_map", None) or {}
        for producer, spec in dict(raw_map).items():
            new = translator.spec(spec, node, producer)
            changed = changed or new is not spec
            input_map[producer] = new
        output = translator.spec(annotation.output_qspec, node)
        changed = changed or output is not annotation.output_qspec
        if not changed:
            annotated.append((node, annotation))
            continue
        fields = {
            "input_qspec_map": input_map,
            "output_qspec": output,
            "allow_implicit_sharing": bool(getattr(annotation, "allow_implicit_sharing", True)),
            "_annotated": bool(getattr(annotation, "_annotated", False)),
        }
        if native:
            node.meta[ANNOTATION_KEY] = translated = dataclasses.replace(annotation, **fields)
        else:
            node.meta[ANNOTATION_KEY] = translated = QuantizationAnnotation(**fields)
            hosted.add(node)
            replaced += 1
        annotated.append((node, translated))
    annotated = _resolve_float(graph, annotated)
    _drop_non_inputs(graph, label, hosted, annotated)
    return replaced


def _native_specs(annotation: QuantizationAnnotation) -> bool:
    """True when every spec of ``annotation`` is None or quantweave's (the translation keeps them)."""
    output = annotation.output_qspec
    if output is not None and not isinstance(output, QuantizationSpecBase):
        return False
    return all(spec is None or isinstance(spec, QuantizationSpecBase) for spec in annotation.input_qspec_map.values())


def _resolve_float(
    graph: Graph, annotated: list[tuple[Node, QuantizationAnnotation]]
) -> list[tuple[Node, QuantizationAnnotation]]:
    """Specs translated to "left float" become None, and so do shared specs whose chain of
    sharing ends at one (under torchao they share the float observer convert removes).
    ``annotated``: every annotation of ``graph``; returns them as they are afterwards."""
    if not any(s is _FLOAT for _, a in annotated for s in (a.output_qspec, *a.input_qspec_map.values())):
        return annotated
    specs: dict[EdgeOrNode, Any] = {}
    for node, annotation in annotated:
        for producer, spec in annotation.input_qspec_map.items():
            specs[(producer, node)] = spec
        specs[node] = annotation.output_qspec

    def is_float(spec: Any, depth: int = 0) -> bool:
        while isinstance(spec, SharedQuantizationSpec) and depth < len(specs):
            spec, depth = specs.get(spec.edge_or_node), depth + 1
        return spec is _FLOAT

    resolved = []
    for node, annotation in annotated:
        input_map = {p: (None if is_float(s) else s) for p, s in annotation.input_qspec_map.items()}
        output = None if is_float(annotation.output_qspec) else annotation.output_qspec
        new = dataclasses.replace(annotation, input_qspec_map=input_map, output_qspec=output)
        node.meta[ANNOTATION_KEY] = new
        resolved.append((node, new))
    for node, annotation in annotated:
        keyed: list[tuple[EdgeOrNode, Any]] = [((p, node), s) for p, s in annotation.input_qspec_map.items()]
        for key, spec in [*keyed, (node, annotation.output_qspec)]:
            if isinstance(spec, DerivedQuantizationSpec) and any(is_float(specs.get(k)) for k in spec.derived_from):
                raise SharingError(
                    f"{_describe(key)}: its DerivedQuantizationSpec derives qparams from a float32 spec "
                    "(a tensor left float has no qparams)"
                )
    return resolved


def _describe(key: EdgeOrNode) -> str:
    if isinstance(key, tuple):
        return f"edge {key[0].name!r} -> {key[1].name!r}"
    return f"output of {key.name!r}"


def _drop_non_inputs(
    graph: Graph,
    label: Callable[[Node], str],
    hosted: set[Node],
    annotated: list[tuple[Node, QuantizationAnnotation]],
) -> None:
    """Input-map entries naming a node of ``graph`` that is not an input (see the module
    docstring). Entries naming nodes of another graph are left for collect_specs to report.
    ``annotated``: every annotation of ``graph``."""
    stray: list[tuple[Node, Node]] = []
    for node, annotation in annotated:
        for producer, spec in annotation.input_qspec_map.items():
            # an input of node: node is one of its users (fx keeps both sides of every edge)
            if not isinstance(producer, Node) or producer.graph is not graph or node in producer.users:
                continue
            if spec is not None and node not in hosted:
                inputs = node.all_input_nodes
                raise AnnotationError(
                    f"node {node.name!r}: input_qspec_map names {producer.name!r}, which is not one of its inputs "
                    f"{[n.name for n in inputs]}: quantizer {label(node)!r} put a spec on an edge that does not exist "
                    "(torchao ignores such an entry; quantweave drops it only when its spec is None)"
                )
            stray.append((producer, node))
    if not stray:
        return
    referenced: dict[tuple[Node, Node], EdgeOrNode] = {}
    for node, annotation in annotated:
        keys: list[tuple[EdgeOrNode, Any]] = [((p, node), s) for p, s in annotation.input_qspec_map.items()]
        keys.append((node, annotation.output_qspec))
        for key, spec in keys:
            targets: list[Any] = []
            if isinstance(spec, SharedQuantizationSpec):
                targets = [spec.edge_or_node]
            elif isinstance(spec, DerivedQuantizationSpec):
                targets = list(spec.derived_from)
            for target in targets:
                if isinstance(target, tuple):
                    referenced.setdefault(target, key)
    drop = {edge for edge in stray if edge not in referenced}  # a referenced one stays for its group
    for node, annotation in annotated:
        if any((p, node) in drop for p in annotation.input_qspec_map):
            kept = {p: s for p, s in annotation.input_qspec_map.items() if (p, node) not in drop}
            node.meta[ANNOTATION_KEY] = dataclasses.replace(annotation, input_qspec_map=kept)


# -- observers ---------------------------------------------------------------------------


def convertible(module: object) -> str | None:
    """None when convert can turn ``module`` into quantize/dequantize ops (or the module
    converts itself with its own ``convert(model, observer_node)``, as torchao's affine
    observers do), else why not."""
    from ..observers import is_observer_module
    from .convert_rules import convert_hook

    if is_observer_module(module) or convert_hook(module) is not None:
        return None
    missing = [name for name in ("calculate_qparams", "dtype") if not hasattr(module, name)]
    return (
        "it is not an observer or fake-quantize module convert recognises (no "
        + ", ".join(missing or ["qscheme"])
        + ")"
    )


def check_observers(observers: dict[EdgeOrNode, Any], label: Callable[[EdgeOrNode], str]) -> None:
    """Raise AnnotationError naming the observer, the edge and the quantizer for the first
    observer in the plan that convert would not recognise (it would be left in place)."""
    for key, observer in observers.items():
        reason = convertible(observer)
        if reason is not None:
            raise AnnotationError(
                f"{_describe(key)}: quantizer {label(key)!r} asks for observer {_origin(observer)}, which "
                f"convert_pt2e cannot turn into quantize/dequantize ops: {reason}"
            )

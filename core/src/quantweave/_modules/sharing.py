"""From annotations to observer instances: which edges/nodes share one observer.

Steps (all independent of graph order):

1. collect every (edge or node) -> spec from the annotations, validating references (an
   input-map entry naming a node of the graph that is not an input -- a hosted torchao
   quantizer's -- is kept only as the target of a shared / derived spec: its group's
   observer observes the real edges and nodes, as under torchao);
2. union-find over explicit sharing (:class:`SharedQuantizationSpec`); a group with no
   concrete spec is a cycle and is reported with its members;
3. implicit sharing: an input edge joins the producer's output group and the groups of the
   producer's other consumer edges when their concrete specs agree on dtype, range, qscheme,
   ch_axis, scale, zero point and group size (opt out per node with ``allow_implicit_sharing=False``);
4. one observer per group, built from the group's first concrete spec in graph order;
   derived specs are built after the groups they derive from (cycles reported).
"""

from __future__ import annotations

import functools
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
from ..observers import DerivedObserver, FixedQParamsFakeQuantize, FixedQParamsObserver
from .qtypes import dtype_range, float8_range, is_float8_dtype, is_per_channel
from .torch_compat import with_observer_kwargs

_SHARING_ATTRS = (
    "dtype",
    "is_dynamic",
    "quant_min",
    "quant_max",
    "qscheme",
    "ch_axis",
    "scale",
    "zero_point",
    "group_size",
    "per_token",
)
_MISSING = object()


def describe(key: EdgeOrNode) -> str:
    """Human name of an edge or node, for error messages."""
    if isinstance(key, Node):
        return f"output of {key.name!r}"
    if isinstance(key, tuple) and len(key) == 2:
        producer, consumer = key
        return f"edge {getattr(producer, 'name', producer)!r} -> {getattr(consumer, 'name', consumer)!r}"
    return repr(key)


def collect_specs(graph: Graph) -> dict[EdgeOrNode, QuantizationSpecBase]:
    """Every annotated edge/node and its spec, in graph order; None specs are skipped."""
    specs: dict[EdgeOrNode, QuantizationSpecBase] = {}
    phantoms: list[tuple[Node, Node]] = []  # annotated edges that are not edges of the graph
    for node in graph.nodes:
        annotation = node.meta.get(ANNOTATION_KEY)
        if annotation is None:
            continue
        if not isinstance(annotation, QuantizationAnnotation):
            raise AnnotationError(
                f"node {node.name!r}: meta[{ANNOTATION_KEY!r}] must be a "
                f"QuantizationAnnotation; got {type(annotation).__name__}"
            )
        inputs = node.all_input_nodes
        for producer, spec in annotation.input_qspec_map.items():
            if isinstance(producer, Node) and producer not in inputs and producer.graph is graph and spec is not None:
                phantoms.append((producer, node))  # kept for sharing when a spec refers to it (checked below)
            elif not isinstance(producer, Node) or producer not in inputs:
                raise AnnotationError(
                    f"node {node.name!r}: input_qspec_map names "
                    f"{getattr(producer, 'name', producer)!r}, which is not one of its inputs "
                    f"{[n.name for n in inputs]} (was it annotated on another graph?)"
                )
            if spec is not None:
                _check_spec_type(spec, f"edge {producer.name!r} -> {node.name!r}")
                specs[(producer, node)] = spec
        if annotation.output_qspec is not None:
            _check_spec_type(annotation.output_qspec, f"output of {node.name!r}")
            specs[node] = annotation.output_qspec
    referenced = {target for spec in specs.values() for target in _references(spec)}
    for producer, node in phantoms:
        if (producer, node) not in referenced:
            inputs = node.all_input_nodes
            raise AnnotationError(
                f"node {node.name!r}: input_qspec_map names {producer.name!r}, which is not one of its inputs "
                f"{[n.name for n in inputs]}"
            )
    for key, spec in specs.items():
        for target in _references(spec):
            if target not in specs:
                kind = type(spec).__name__
                raise SharingError(
                    f"{describe(key)}: {kind} refers to {describe(target)}, which has no "
                    "quantization spec (not annotated, annotated with None, or not an edge "
                    "of this graph)"
                )
    return specs


def _check_spec_type(spec: object, where: str) -> None:
    if not isinstance(spec, QuantizationSpecBase):
        raise AnnotationError(
            f"{where}: expected a QuantizationSpecBase (QuantizationSpec, "
            f"SharedQuantizationSpec, ...); got {type(spec).__name__}"
        )


def _references(spec: QuantizationSpecBase) -> list[EdgeOrNode]:
    if isinstance(spec, SharedQuantizationSpec):
        return [spec.edge_or_node]
    if isinstance(spec, DerivedQuantizationSpec):
        return list(spec.derived_from)
    return []


class _Groups:
    """Union-find over edges/nodes; each root remembers its first concrete spec (graph order)."""

    def __init__(self, specs: dict[EdgeOrNode, QuantizationSpecBase]) -> None:
        self.specs = specs
        self.order = {k: i for i, k in enumerate(specs)}
        self.parent: dict[EdgeOrNode, EdgeOrNode] = {k: k for k in specs}
        self.first_concrete: dict[EdgeOrNode, EdgeOrNode] = {
            k: k for k, spec in specs.items() if not isinstance(spec, SharedQuantizationSpec)
        }

    def find(self, key: EdgeOrNode) -> EdgeOrNode:
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:  # path compression
            self.parent[key], key = root, self.parent[key]
        return root

    def union(self, a: EdgeOrNode, b: EdgeOrNode) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        self.parent[rb] = ra
        candidates = [self.first_concrete[r] for r in (ra, rb) if r in self.first_concrete]
        self.first_concrete.pop(rb, None)
        if candidates:
            self.first_concrete[ra] = min(candidates, key=self.order.__getitem__)

    def concrete(self, key: EdgeOrNode) -> QuantizationSpecBase | None:
        first = self.first_concrete.get(self.find(key))
        return None if first is None else self.specs[first]


def _same_attrs(a: QuantizationSpecBase, b: QuantizationSpecBase) -> bool:
    return all(getattr(a, name, _MISSING) == getattr(b, name, _MISSING) for name in _SHARING_ATTRS)


#: what :func:`group_specs` returns: each key's group root, and each root's concrete spec
Groups = tuple[dict[EdgeOrNode, EdgeOrNode], dict[EdgeOrNode, QuantizationSpecBase]]


def group_specs(specs: dict[EdgeOrNode, QuantizationSpecBase]) -> Groups:
    """Map each key to its group root, and each root to the group's concrete spec."""
    groups = _Groups(specs)
    for key, spec in specs.items():
        if isinstance(spec, SharedQuantizationSpec):
            groups.union(spec.edge_or_node, key)
    for key in specs:
        if groups.concrete(key) is None:
            root = groups.find(key)
            members = [k for k in specs if groups.find(k) == root]
            raise SharingError(
                "cyclic SharedQuantizationSpec: "
                + ", ".join(describe(k) for k in members)
                + " share only with each other, so no member has a concrete spec to take "
                "qparams from"
            )

    # Implicit sharing: an input edge, the producer's output and the producer's other
    # consumer edges are the same tensor; merge their groups when the specs agree.
    for key in specs:
        if not isinstance(key, tuple):
            continue
        producer, consumer = key
        if not consumer.meta[ANNOTATION_KEY].allow_implicit_sharing:
            continue
        candidates: list[EdgeOrNode] = [(producer, u) for u in producer.users if u is not consumer]
        candidates.append(producer)
        for other in candidates:
            if other not in specs:
                continue
            mine, theirs = groups.concrete(key), groups.concrete(other)
            assert mine is not None and theirs is not None
            if _same_attrs(theirs, mine):
                groups.union(other, key)

    roots = {key: groups.find(key) for key in specs}
    concrete = {root: specs[first] for root, first in groups.first_concrete.items()}
    return roots, concrete


def build_observers(
    specs: dict[EdgeOrNode, QuantizationSpecBase], is_qat: bool, groups: Groups | None = None
) -> dict[EdgeOrNode, torch.nn.Module]:
    """One observer (or fake-quantize) per sharing group, mapped from every member
    (``groups``: ``group_specs(specs)`` when the caller has it)."""
    roots, concrete = group_specs(specs) if groups is None else groups
    by_root: dict[EdgeOrNode, torch.nn.Module] = {}
    building: list[EdgeOrNode] = []
    constructors: dict[int, Callable[[], torch.nn.Module]] = {}  # id(spec) -> its observers' constructor

    def observer_for(root: EdgeOrNode) -> torch.nn.Module:
        if root in by_root:
            return by_root[root]
        if root in building:
            cycle = [*building[building.index(root) :], root]
            raise SharingError(
                "cyclic DerivedQuantizationSpec: "
                + " -> ".join(describe(k) for k in cycle)
                + " derive their qparams from each other"
            )
        building.append(root)
        spec = concrete[root]
        try:
            if isinstance(spec, DerivedQuantizationSpec):
                sources = [observer_for(roots[k]) for k in spec.derived_from]
                observer = _derived_observer(spec, sources)
            else:
                ctr = constructors.get(id(spec))  # one spec object often serves many groups
                if ctr is None:
                    ctr = constructors[id(spec)] = _observer_constructor(spec, is_qat)
                observer = ctr()
        except SharingError:
            raise
        except Exception as exc:
            raise AnnotationError(
                f"{describe(root)}: could not build an observer for {spec!r}: {exc}{_fix_for(spec, exc)}"
            ) from exc
        building.pop()
        by_root[root] = observer
        return observer

    return {key: observer_for(roots[key]) for key in specs}


def _fix_for(spec: QuantizationSpecBase, exc: Exception) -> str:
    """The fix for a constructor that does not take a spec's ``group_size`` (a per-channel
    observer given a group-wise spec), else nothing."""
    group_size = getattr(spec, "group_size", None)
    if group_size is not None and isinstance(exc, TypeError) and "group_size" in str(exc):
        return (
            f"; a group-wise spec (group_size={group_size}) needs an observer that takes group_size, e.g. "
            "quantweave.observers.PerGroupMinMaxObserver"
        )
    return ""


def _derived_observer(spec: DerivedQuantizationSpec, sources: list[torch.nn.Module]) -> torch.nn.Module:
    lo, hi = dtype_range(spec.dtype)
    return DerivedObserver(
        sources,
        spec.derive_qparams_fn,
        dtype=spec.dtype,
        quant_min=lo if spec.quant_min is None else spec.quant_min,
        quant_max=hi if spec.quant_max is None else spec.quant_max,
        qscheme=spec.qscheme if spec.qscheme is not None else torch.per_tensor_affine,
        ch_axis=spec.ch_axis,
    )


def _observer_constructor(spec: QuantizationSpecBase, is_qat: bool) -> Callable[[], torch.nn.Module]:
    """A zero-argument constructor of ``spec``'s observer (or fake-quantize), a new one per call."""
    if isinstance(spec, FixedQParamsQuantizationSpec):
        lo, hi = dtype_range(spec.dtype)
        fixed_kwargs = {
            "scale": spec.scale,
            "zero_point": spec.zero_point,
            "dtype": spec.dtype,
            "qscheme": spec.qscheme if spec.qscheme is not None else torch.per_tensor_affine,
            "quant_min": lo if spec.quant_min is None else spec.quant_min,
            "quant_max": hi if spec.quant_max is None else spec.quant_max,
        }
        ctr = with_observer_kwargs(FixedQParamsObserver, fixed_kwargs)
        if is_qat:
            return functools.partial(FixedQParamsFakeQuantize, observer=ctr)
        return ctr
    assert isinstance(spec, QuantizationSpec)
    kwargs: dict[str, Any] = {
        "dtype": spec.dtype,
        "quant_min": spec.quant_min,
        "quant_max": spec.quant_max,
        "qscheme": spec.qscheme,
        "is_dynamic": spec.is_dynamic,
    }
    if is_per_channel(spec.qscheme):
        kwargs["ch_axis"] = spec.ch_axis
    if is_float8_dtype(spec.dtype):  # bounds left None: the dtype's finite range
        low, high = float8_range(spec.dtype)
        kwargs["quant_min"] = low if spec.quant_min is None else spec.quant_min
        kwargs["quant_max"] = high if spec.quant_max is None else spec.quant_max
    if getattr(spec, "group_size", None) is not None:  # group-wise: the observer must take group_size
        kwargs["group_size"] = spec.group_size
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return with_observer_kwargs(spec.observer_or_fake_quant_ctr, kwargs)

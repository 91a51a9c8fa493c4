"""What a composed member changed in an annotation an earlier member made, in words.

``ComposableQuantizer`` snapshots each annotation when its owner made it; when a later
member replaces, removes or mutates it, :func:`describe_change` lists each difference --
which input edge or the output spec, from which spec to which -- for the conflict error.
Works on quantweave's annotations and on torchao's / torch.ao's (read by their fields).
"""

from __future__ import annotations

from typing import Any

from torch.fx import Node

__all__ = ["Snapshot", "describe_change", "snapshot", "spec_summary"]

#: (input_qspec_map items, output_qspec, allow_implicit_sharing, _annotated)
Snapshot = tuple[tuple[tuple[Node, Any], ...], Any, bool, bool]


def snapshot(annotation: Any) -> Snapshot:
    """The value of an annotation (quantweave's or one with PT2E's fields)."""
    return (
        tuple((getattr(annotation, "input_qspec_map", None) or {}).items()),
        getattr(annotation, "output_qspec", None),
        bool(getattr(annotation, "allow_implicit_sharing", True)),
        bool(getattr(annotation, "_annotated", False)),
    )


def _name(value: Any) -> str:
    if isinstance(value, Node):
        return repr(value.name)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, Node) for v in value):
        return f"edge {value[0].name!r} -> {value[1].name!r}"
    return repr(value)


def spec_summary(spec: Any) -> str:
    """A short description of a spec: its class and the fields that tell it apart."""
    if spec is None:
        return "None (float)"
    kind = type(spec).__name__
    if hasattr(spec, "edge_or_node"):
        return f"{kind}({_name(spec.edge_or_node)})"
    if hasattr(spec, "derived_from"):
        return f"{kind}(from {', '.join(_name(k) for k in spec.derived_from)}, {getattr(spec, 'dtype', None)})"
    fields = []
    for name in ("dtype", "qscheme", "quant_min", "quant_max", "ch_axis", "scale", "zero_point"):
        value = getattr(spec, name, None)
        if value is not None:
            fields.append(str(value) if name in ("dtype", "qscheme") else f"{name}={value}")
    if getattr(spec, "is_dynamic", False):
        fields.append("dynamic")
    ctr = getattr(spec, "observer_or_fake_quant_ctr", None)
    if ctr is not None:
        inner = getattr(getattr(ctr, "p", None), "func", None) or getattr(ctr, "func", None) or ctr
        fields.append(getattr(inner, "__name__", type(inner).__name__))
    return f"{kind}({', '.join(fields)})"


def describe_change(before: Snapshot, after: Snapshot | None) -> str:
    """Each difference between two snapshots ("input edge 'x': A -> B; output spec: ...")."""
    if after is None:
        return "the annotation was removed"
    changes: list[str] = []
    old_inputs, new_inputs = dict(before[0]), dict(after[0])
    for producer in dict.fromkeys([*old_inputs, *new_inputs]):
        name = getattr(producer, "name", producer)
        if producer not in new_inputs:
            changes.append(f"input edge from {name!r} removed (was {spec_summary(old_inputs[producer])})")
        elif producer not in old_inputs:
            changes.append(f"input edge from {name!r} added: {spec_summary(new_inputs[producer])}")
        elif old_inputs[producer] != new_inputs[producer]:
            changes.append(
                f"input edge from {name!r}: {spec_summary(old_inputs[producer])} -> "
                f"{spec_summary(new_inputs[producer])}"
            )
    if before[1] != after[1]:
        changes.append(f"output spec: {spec_summary(before[1])} -> {spec_summary(after[1])}")
    if before[2] != after[2]:
        changes.append(f"allow_implicit_sharing: {before[2]} -> {after[2]}")
    if before[3] != after[3]:
        changes.append(f"_annotated: {before[3]} -> {after[3]}")
    return "; ".join(changes) if changes else "a new annotation object with the same specs"

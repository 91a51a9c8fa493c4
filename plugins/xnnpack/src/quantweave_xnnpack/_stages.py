"""Which config claims a pattern: module name > module type > operator type > global, each a
stage the quantizer runs in that order (the first stage to annotate a node wins)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

import quantweave as qw

__all__ = ["GLOBAL", "Stage", "op_matches", "stages", "type_name"]

NodeFilter = Callable[[Node], bool]
GLOBAL = "global config"


@dataclass(frozen=True)
class Stage:
    config: qw.QuantizationConfig | None
    accepts: NodeFilter
    description: str
    operator: Any = None  # operator-type stage: only patterns anchored on this op


def op_matches(operator: Any, target: Any) -> bool:
    if isinstance(operator, torch._ops.OpOverloadPacket):
        return getattr(target, "overloadpacket", None) is operator
    return bool(target == operator)


def type_name(module_type: type) -> str:
    return f"{module_type.__module__}.{module_type.__qualname__}"


def _module_paths(node: Node) -> list[str]:
    out = []
    for entry in node.meta.get("nn_module_stack", {}).values():
        path = entry[0] if isinstance(entry, tuple) else str(entry)
        out.append(path.removeprefix("L['self']."))
    return out


def _module_types(node: Node) -> set[str]:
    out = set()
    for entry in node.meta.get("nn_module_stack", {}).values():
        if isinstance(entry, tuple) and len(entry) > 1:
            kind = entry[1]
            out.add(type_name(kind) if isinstance(kind, type) else str(kind))
    return out


def stages(
    module_name_config: Mapping[str, qw.QuantizationConfig | None],
    module_type_config: Mapping[type, qw.QuantizationConfig | None],
    operator_type_config: Mapping[Any, qw.QuantizationConfig | None],
    global_config: qw.QuantizationConfig | None,
) -> list[Stage]:
    """The stages in the order they claim nodes. Operator-type and global stages take only
    nodes in no submodule that has a module name or module type config."""
    names = tuple(module_name_config)
    types = frozenset(type_name(t) for t in module_type_config)

    def outside(n: Node) -> bool:
        return not any(name in _module_paths(n) for name in names) and not (_module_types(n) & types)

    def in_module(name: str) -> NodeFilter:
        return lambda n: name in _module_paths(n)

    def of_type(module_type: type) -> NodeFilter:
        qualified = type_name(module_type)
        return lambda n: qualified in _module_types(n)

    out = [Stage(config, in_module(name), f"module name {name!r}") for name, config in module_name_config.items()]
    out += [Stage(config, of_type(tp), f"module type {tp.__name__}") for tp, config in module_type_config.items()]
    out += [Stage(config, outside, f"operator type {op}", operator=op) for op, config in operator_type_config.items()]
    out.append(Stage(global_config, outside, GLOBAL))
    return out

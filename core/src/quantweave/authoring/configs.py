"""Which config applies where: module name > module type > operator type > global."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch.fx import Node

from ..annotation import QuantizationConfig, QuantizationSpec
from .graph import op_matches
from .modules import in_module, in_module_type, module_paths, module_types, type_name

__all__ = ["ConfigStage", "ConfigStages", "check_config", "config_key"]

_KINDS = ("module_name", "module_type", "operator_type", "global")


def check_config(setter: str, config: object, config_type: type = QuantizationConfig) -> Any:
    """``config`` when it is a ``config_type`` (default :class:`~quantweave.QuantizationConfig`)
    or None; else a :class:`TypeError` naming ``setter`` and what it got."""
    if config is not None and not isinstance(config, config_type):
        expected = "quantweave.QuantizationConfig" if config_type is QuantizationConfig else config_type.__name__
        article = "an" if expected[0].lower() in "aeiou" else "a"
        raise TypeError(f"{setter}: expected {article} {expected} or None; got {type(config).__name__}")
    return config


@dataclass(frozen=True)
class ConfigStage:
    """One step of the resolution order.

    ``kind`` is ``"module_name"``, ``"module_type"``, ``"operator_type"`` or ``"global"``;
    ``key`` the module name, module class or operator (None for global); ``config`` the
    config it applies (None: what it covers stays float); ``description`` names it in skip
    reasons (``"module name 'head'"``, ``"operator type aten.linear.default"``,
    ``"global config"``); ``accepts(node)`` tells whether the stage covers a node by where
    it was traced (an operator-type stage does not look at the node's op: see
    :meth:`anchors`)."""

    kind: str
    key: Any
    config: Any
    description: str
    accepts: Callable[[Node], bool]

    def accepts_all(self, nodes: Iterable[Node]) -> bool:
        """True when the stage covers every node of a pattern."""
        return all(self.accepts(n) for n in nodes)

    def anchors(self, targets: Iterable[Any]) -> bool:
        """For an operator-type stage: True when one of ``targets`` is its operator (an
        overload packet matches all its overloads); always True for the other kinds."""
        if self.kind != "operator_type":
            return True
        return any(op_matches(self.key, t) for t in targets)


class ConfigStages:
    """The configs a quantizer holds, resolved one way for every backend.

    **The rule**: a node is covered by the first of these that applies to it,

    1. a module-name config whose submodule the node was traced in (in the order set);
    2. a module-type config whose module class the node was traced in (in the order set);
    3. an operator-type config for the node's op (for a pattern: its anchor op);
    4. the global config.

    A config of ``None`` at any step leaves what it covers float (later steps never see
    it). :meth:`stages` lists the steps for annotation, in that order (annotate each in turn,
    skipping nodes already annotated); :meth:`covering` answers for one node (what a skip
    reason says). With ``exclusive=True`` the operator-type and global steps accept only
    nodes outside every submodule named by a module-name or module-type config (so a
    pattern that crosses a module boundary is never claimed by the outer config); with
    ``exclusive=False`` they accept every node and rely on the earlier steps having claimed
    theirs first::

        stages = ConfigStages(global_config=get_my_config())
        stages.set_module_name("head", None)          # keep the head float
        stages.set_operator_type(torch.ops.aten.linear.default, dynamic_config)
        for stage in stages.stages():
            ...

    ``config_type`` is the class configs must be (default
    :class:`~quantweave.QuantizationConfig`; a backend with its own config class, such as
    an embedding quantizer's, passes that)."""

    def __init__(self, global_config: Any = None, config_type: type = QuantizationConfig) -> None:
        self.config_type = config_type
        self.global_config = check_config("set_global", global_config, config_type)
        self.module_name: dict[str, Any] = {}
        self.module_type: dict[type, Any] = {}
        self.operator_type: dict[Any, Any] = {}

    def set_global(self, config: Any, setter: str = "set_global") -> None:
        self.global_config = check_config(setter, config, self.config_type)

    def set_module_name(self, name: str, config: Any, setter: str = "set_module_name") -> None:
        """Config for every node traced in submodule ``name`` (``"layers.0"``)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{setter}: module_name must be a non-empty str; got {name!r}")
        self.module_name[name] = check_config(setter, config, self.config_type)

    def set_module_type(self, module_type: type, config: Any, setter: str = "set_module_type") -> None:
        """Config for every node traced in a submodule of class ``module_type`` (any depth)."""
        if not isinstance(module_type, type):
            raise TypeError(f"{setter}: expected a module class; got {module_type!r}")
        self.module_type[module_type] = check_config(setter, config, self.config_type)

    def set_operator_type(self, operator: Any, config: Any, setter: str = "set_operator_type") -> None:
        """Config for the patterns anchored on ``operator`` (an aten overload or packet)."""
        self.operator_type[operator] = check_config(setter, config, self.config_type)

    def configs(self) -> list[Any]:
        """Every config held (not None), global first."""
        held = [
            self.global_config,
            *self.module_name.values(),
            *self.module_type.values(),
            *self.operator_type.values(),
        ]
        return [c for c in held if c is not None]

    def _outside(self) -> Callable[[Node], bool]:
        names = tuple(self.module_name)
        types = frozenset(type_name(t) for t in self.module_type)

        def accepts(node: Node) -> bool:
            return not any(name in module_paths(node) for name in names) and not (module_types(node) & types)

        return accepts

    def stages(self, exclusive: bool = True, include_global: bool = True) -> list[ConfigStage]:
        """The steps in resolution order (see the class docstring). ``include_global=False``
        leaves out the global step when there is no global config."""
        rest = self._outside() if exclusive else (lambda node: True)
        out = [
            ConfigStage("module_name", name, config, f"module name {name!r}", in_module(name))
            for name, config in self.module_name.items()
        ]
        out += [
            ConfigStage("module_type", tp, config, f"module type {tp.__name__}", in_module_type(tp))
            for tp, config in self.module_type.items()
        ]
        out += [
            ConfigStage("operator_type", op, config, f"operator type {op}", rest)
            for op, config in self.operator_type.items()
        ]
        if include_global or self.global_config is not None:
            out.append(ConfigStage("global", None, self.global_config, "global config", rest))
        return out

    def covering(self, node: Node) -> ConfigStage:
        """The step that covers ``node`` (by where it was traced, then its op); the global
        step when no other does."""
        paths = module_paths(node)
        for name, config in self.module_name.items():
            if name in paths:
                return ConfigStage("module_name", name, config, f"module name {name!r}", in_module(name))
        types = module_types(node)
        for tp, config in self.module_type.items():
            if type_name(tp) in types:
                return ConfigStage("module_type", tp, config, f"module type {tp.__name__}", in_module_type(tp))
        for op, config in self.operator_type.items():
            if op_matches(op, node.target):
                return ConfigStage("operator_type", op, config, f"operator type {op}", lambda n: True)
        return ConfigStage("global", None, self.global_config, "global config", lambda n: True)


def config_key(value: Any) -> Any:
    """A comparable form of a config or spec: observer constructors (``.with_args``
    partials, which compare by identity) as their class and arguments. Two configs built by
    the same recipe call have equal keys."""
    if isinstance(value, QuantizationConfig):
        return tuple(config_key(getattr(value, f)) for f in ("input_activation", "output_activation", "weight", "bias"))
    if isinstance(value, QuantizationSpec):
        return (
            value.dtype,
            value.quant_min,
            value.quant_max,
            value.qscheme,
            value.ch_axis,
            value.is_dynamic,
            config_key(value.observer_or_fake_quant_ctr),
        )
    partial = getattr(value, "p", None)
    if isinstance(partial, functools.partial):
        return (partial.func, tuple(sorted((k, config_key(v)) for k, v in partial.keywords.items())))
    return value

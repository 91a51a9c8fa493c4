"""Rule tables: one row per pattern, so what a backend declares, annotates and explains agree."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.fx import GraphModule, Node

from ..capabilities import FLOAT, Capability, Mode, Quant, TensorQuant
from .graph import node_op
from .reasons import explain_float

__all__ = ["Rule", "RuleTable"]

_OUTPUTS = ("float", "quantized", "shared")


@dataclass(frozen=True)
class Rule:
    """One pattern a backend quantizes.

    - ``pattern``: its vocabulary name (``"conv2d_relu"``);
    - ``annotate``: the step (a callable of the backend's choosing) that annotates it; rows
      may share a step (one matcher for every ``conv2d_<activation>``);
    - ``why_float``: ``why_float(node) -> str | None``, the reason a node of this pattern's
      ops stayed float (None: this row has nothing to say about that node);
    - ``modes``: the modes the row is declared (and annotated) in;
    - ``option``: the quantizer option that must be on for the row to apply
      (``"enable_matmul"``), or None;
    - declaration: ``weighted`` (a weight, and a float bias), ``output`` (``"float"``,
      ``"quantized"``: the activation's own qparams, ``"shared"``: its first input's, or a
      :class:`~quantweave.plugin_api.Quant`), ``fused``, ``input_from``, ``notes`` (as in
      :class:`~quantweave.plugin_api.Capability`; ``notes`` may map modes to notes: a mode not in it has
      none); a ``"quantized"`` output is declared ``FLOAT`` in ``Mode.DYNAMIC`` (a dynamic
      output is never quantized on its own); ``bias`` (``"auto"``: ``FLOAT`` for a weighted row,
      else unstated; or a ``Quant``, or None); ``ops`` only for a pattern a plugin contributes."""

    pattern: str
    annotate: Callable[..., Any] | None = None
    why_float: Callable[[Node], str | None] | None = None
    modes: tuple[Mode, ...] = (Mode.STATIC,)
    option: str | None = None
    weighted: bool = False
    output: str | Quant = "float"
    fused: bool | None = None
    input_from: str | None = None
    notes: str | Mapping[Mode, str] = ""
    ops: tuple[str, ...] = field(default=())
    bias: Quant | str | None = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "modes", tuple(Mode(m) for m in self.modes))
        if not isinstance(self.output, Quant) and self.output not in _OUTPUTS:
            raise ValueError(
                f"Rule {self.pattern!r}: output must be one of {', '.join(_OUTPUTS)} or a Quant; got {self.output!r}"
            )

        if isinstance(self.bias, str) and self.bias != "auto":
            raise ValueError(f"Rule {self.pattern!r}: bias must be 'auto', a Quant or None; got {self.bias!r}")

    def applies(self, mode: Mode | str, options: Collection[str] = ()) -> bool:
        """True when the row is declared in ``mode`` with these options on."""
        return Mode(mode) in self.modes and (self.option is None or self.option in options)

    def capability(
        self, mode: Mode | str, quantizer: str, activation: TensorQuant | None, weight: Any = None
    ) -> Capability:
        """The row as a :class:`~quantweave.plugin_api.Capability` in ``mode``. ``weight`` is a
        :class:`~quantweave.plugin_api.TensorQuant`, or a callable ``weight(rule) -> TensorQuant | None``
        for a table whose rows quantize their weights differently."""
        mode = Mode(mode)
        if callable(weight) and not isinstance(weight, TensorQuant):
            weight = weight(self)
        if isinstance(self.output, Quant):
            output = self.output
        elif self.output == "shared":
            output = Quant.shared(0)
        elif self.output == "quantized" and activation is not None and mode is not Mode.DYNAMIC:
            output = Quant.quantized(activation)
        else:
            output = FLOAT
        notes = self.notes if isinstance(self.notes, str) else self.notes.get(mode, "")
        return Capability(
            self.pattern,
            Mode(mode),
            activation,
            weight if self.weighted else None,
            quantizer=quantizer,
            ops=self.ops,
            notes=notes,
            output=output,
            bias=(FLOAT if self.weighted else None) if self.bias == "auto" else _quant_or_none(self.bias),
            fused=self.fused,
            input_from=self.input_from,
        )


class RuleTable:
    """A backend's rows, and the order its annotation steps run in.

    ``steps`` lists every distinct ``Rule.annotate`` in the order the backend annotates
    (often not declaration order: fused patterns before their parts); the table refuses a
    step no row names and a row whose step is not listed, so a pattern cannot be declared
    without being annotated, or annotated without being declared::

        TABLE = RuleTable("mybackend", [
            Rule("linear", annotate=annotate_linear, weighted=True, why_float=why_linear),
            Rule("linear_relu", annotate=annotate_linear_relu, weighted=True, fused=True),
        ], steps=[annotate_linear_relu, annotate_linear])

        def declared_capabilities(mode="static"):
            return TABLE.capabilities(mode, activation=ACT, weight=WEIGHT)

        def annotate(self, model):
            for step in TABLE.steps_for(Mode.STATIC):
                step(self, model)
            TABLE.explain_float(model)   # a reason on every float node of a declared op
            return model
    """

    def __init__(self, quantizer: str, rules: Iterable[Rule], steps: Sequence[Callable[..., Any]] = ()) -> None:
        self.quantizer = quantizer
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.steps: tuple[Callable[..., Any], ...] = tuple(steps)
        self._ops: dict[str, tuple[str, ...]] | None = None
        seen: set[str] = set()
        for rule in self.rules:
            if not isinstance(rule, Rule):
                raise TypeError(f"RuleTable {quantizer!r}: expected Rule rows; got {type(rule).__name__}")
            if not rule.modes:
                raise ValueError(f"RuleTable {quantizer!r}: pattern {rule.pattern!r} is declared in no mode")
            if rule.pattern in seen:
                raise ValueError(f"RuleTable {quantizer!r}: pattern {rule.pattern!r} has two rows")
            seen.add(rule.pattern)
            if rule.annotate is not None and self.steps and rule.annotate not in self.steps:
                raise ValueError(
                    f"RuleTable {quantizer!r}: the step of pattern {rule.pattern!r} "
                    f"({getattr(rule.annotate, '__name__', rule.annotate)}) is not in steps"
                )
        named = {id(rule.annotate) for rule in self.rules}
        for step in self.steps:
            if id(step) not in named:
                raise ValueError(
                    f"RuleTable {quantizer!r}: step {getattr(step, '__name__', step)} annotates no declared pattern"
                )

    def __iter__(self) -> Any:
        return iter(self.rules)

    def __getitem__(self, pattern: str) -> Rule:
        for rule in self.rules:
            if rule.pattern == pattern:
                return rule
        raise KeyError(f"RuleTable {self.quantizer!r} has no row for pattern {pattern!r}")

    def patterns(self, mode: Mode | str, options: Collection[str] = ()) -> tuple[str, ...]:
        """The patterns declared in ``mode`` with these options on, in row order."""
        return tuple(r.pattern for r in self.rules if r.applies(mode, options))

    def capabilities(
        self,
        mode: Mode | str,
        activation: TensorQuant | None,
        weight: Any = None,
        options: Collection[str] = (),
    ) -> tuple[Capability, ...]:
        """The declaration: one :class:`~quantweave.plugin_api.Capability` per row that applies
        (``weight``: a :class:`~quantweave.plugin_api.TensorQuant` or ``weight(rule)``, as in
        :meth:`Rule.capability`)."""
        return tuple(
            r.capability(mode, self.quantizer, activation, weight) for r in self.rules if r.applies(mode, options)
        )

    def steps_for(self, mode: Mode | str, options: Collection[str] = ()) -> list[Callable[..., Any]]:
        """The annotation steps of the rows that apply, each once, in ``steps`` order (row
        order when the table was given no ``steps``)."""
        wanted = [r.annotate for r in self.rules if r.annotate is not None and r.applies(mode, options)]
        order = self.steps or tuple(dict.fromkeys(wanted))
        return [s for s in order if any(s is w for w in wanted)]

    def ops_of(self, pattern: str) -> tuple[str, ...]:
        """The vocabulary ops of one row's pattern."""
        if self._ops is None:
            self._ops = {
                r.pattern: r.ops or r.capability(r.modes[0], self.quantizer, _act_for(r), _ANY_ACT).ops
                for r in self.rules
            }
        return self._ops[pattern]

    def ops(self) -> frozenset[str]:
        """Every vocabulary op of every row's pattern (in any mode)."""
        return frozenset(op for rule in self.rules for op in self.ops_of(rule.pattern))

    def reason(self, node: Node) -> str | None:
        """The first reason a row whose pattern contains ``node``'s op gives for it."""
        op = node_op(node)
        for rule in self.rules:
            if rule.why_float is None:
                continue
            if op in self.ops_of(rule.pattern):
                found = rule.why_float(node)
                if found is not None:
                    return found
        return None

    def explain_float(self, model: GraphModule, why: Callable[[Node], str | None] | None = None) -> int:
        """Record why each float node of one of the table's ops stayed float: ``why(node)``
        when given (a backend's checks that come before the rows'), else :meth:`reason`."""
        return explain_float(model, self.ops(), why or self.reason)


def _quant_or_none(value: Quant | str | None) -> Quant | None:
    return value if isinstance(value, Quant) else None


_ANY_ACT = TensorQuant("uint8", 0, 255, "per_tensor", symmetric=False)


def _act_for(rule: Rule) -> TensorQuant | None:
    return None if rule.modes and rule.modes[0] is Mode.WEIGHT_ONLY else _ANY_ACT

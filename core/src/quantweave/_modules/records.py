"""The capability records (:class:`Capability`, :class:`TensorQuant`, :class:`Quant`,
:class:`Mode`): public through :mod:`quantweave.capabilities` and :mod:`quantweave.plugin_api`.

They live here, below both the capabilities module and the derivation by probing
(:mod:`quantweave._modules.derive`), so that ``capabilities.derive_capabilities`` can call the
derivation without an import cycle.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..vocabulary.core import PATTERNS
from ..vocabulary.spec import PATTERN_NAME
from .qtypes import INTEGER_DTYPES, dtype_range, granularity, is_integer_dtype, is_per_channel, is_symmetric

__all__ = [
    "FLOAT",
    "Capability",
    "Mode",
    "Quant",
    "TensorQuant",
    "capability_sort_key",
    "sort_capabilities",
    "tensor_quant_from_spec",
]


class Mode(enum.StrEnum):
    """How a pattern is quantized."""

    STATIC = "static"  # calibrated activation and weight qparams (PTQ)
    DYNAMIC = "dynamic"  # activation qparams computed at run time
    QAT = "qat"  # fake-quantize during training
    WEIGHT_ONLY = "weight_only"  # weights quantized, activations float

    def __str__(self) -> str:
        return self.value


_GRANULARITIES = ("per_tensor", "per_channel", "per_channel_float_qparams", "per_group", "per_token")
_DTYPES = tuple(str(d).removeprefix("torch.") for d in INTEGER_DTYPES)


@dataclass(frozen=True, order=True)
class TensorQuant:
    """How one tensor (activation, weight or bias) is quantized: dtype, range,
    granularity, symmetry, and for per-channel granularities the channel axis.

    ``ch_axis=None`` on a per-channel declaration leaves the axis unstated (as plugin
    API 1 declarations did); the conformance kit checks what is stated.

    ``granularity="per_group"`` with ``group_size``: qparams per row (``ch_axis`` 0) and per
    run of ``group_size`` elements along it (a ``QuantizationSpec`` with ``group_size``;
    converted to ``quantize_per_channel_group``). ``group_size`` is stated for ``per_group``
    only, and always.

    ``granularity="per_token"``: dynamic, one (scale, zero point) per row over the last
    dimension, chosen at run time (a ``QuantizationSpec`` with ``per_token=True``; converted
    to ``choose_qparams_per_token_asymmetric`` / ``quantize_per_token`` /
    ``dequantize_per_token``): int8 [-128, 127], affine, no ``ch_axis``."""

    dtype: str
    quant_min: int
    quant_max: int
    granularity: str = "per_tensor"
    symmetric: bool = False
    ch_axis: int | None = None
    group_size: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"TensorQuant: dtype must be one of {', '.join(_DTYPES)}; got {self.dtype!r}")
        if self.granularity not in _GRANULARITIES:
            raise ValueError(
                f"TensorQuant: granularity must be one of {', '.join(_GRANULARITIES)}; got {self.granularity!r}"
            )
        lo, hi = dtype_range(getattr(torch, self.dtype))
        if not lo <= self.quant_min <= self.quant_max <= hi:
            raise ValueError(
                f"TensorQuant: expected {lo} <= quant_min <= quant_max <= {hi} for {self.dtype}; "
                f"got quant_min={self.quant_min}, quant_max={self.quant_max}"
            )
        if self.ch_axis is not None and (
            self.granularity in ("per_tensor", "per_token") or not isinstance(self.ch_axis, int)
        ):
            raise ValueError(
                f"TensorQuant: ch_axis is an int stated for per-channel granularities only; got ch_axis="
                f"{self.ch_axis!r} with granularity {self.granularity!r}"
            )
        grouped = self.granularity == "per_group"
        if grouped != (self.group_size is not None):
            raise ValueError(
                f"TensorQuant: group_size is stated with granularity 'per_group' and only then; got group_size="
                f"{self.group_size!r} with granularity {self.granularity!r}"
            )
        if grouped and (
            isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2
        ):
            raise ValueError(f"TensorQuant: group_size must be an int >= 2; got {self.group_size!r}")

    def conforms(self, found: TensorQuant | None) -> bool:
        """True when ``found`` (what an annotation says) is what this declares; an unstated
        ``ch_axis`` is not compared."""
        if found is None:
            return False
        return self == (found if self.ch_axis is not None else replace(found, ch_axis=None))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "dtype": self.dtype,
            "quant_min": self.quant_min,
            "quant_max": self.quant_max,
            "granularity": self.granularity,
            "symmetric": self.symmetric,
            "ch_axis": self.ch_axis,
        }
        if self.group_size is not None:  # only per_group records carry the key
            data["group_size"] = self.group_size
        return data

    def __str__(self) -> str:
        kind = "sym" if self.symmetric else "affine"
        axis = "" if self.ch_axis is None else f" axis {self.ch_axis}"
        group = "" if self.group_size is None else f"({self.group_size})"
        return f"{self.dtype}[{self.quant_min},{self.quant_max}] {self.granularity}{group}{axis} {kind}"


def tensor_quant_from_spec(spec: Any) -> TensorQuant | None:
    """The :class:`TensorQuant` a ``QuantizationSpec``-like object describes (None if not one)."""
    dtype = getattr(spec, "dtype", None)
    if not is_integer_dtype(dtype) or not hasattr(spec, "quant_min"):
        return None
    lo, hi = dtype_range(dtype)
    qmin = lo if spec.quant_min is None else spec.quant_min
    qmax = hi if spec.quant_max is None else spec.quant_max
    qscheme = getattr(spec, "qscheme", None)
    axis = getattr(spec, "ch_axis", None) if is_per_channel(qscheme) else None
    name = str(dtype).removeprefix("torch.")
    if getattr(spec, "per_token", False):
        return TensorQuant(name, int(qmin), int(qmax), "per_token", False)
    group_size = getattr(spec, "group_size", None)
    if group_size is not None:
        return TensorQuant(name, int(qmin), int(qmax), "per_group", is_symmetric(qscheme), axis, int(group_size))
    return TensorQuant(name, int(qmin), int(qmax), granularity(qscheme), is_symmetric(qscheme), axis)


_QUANT_KINDS = ("quantized", "shared", "fixed", "float")


@dataclass(frozen=True)
class Quant:
    """What a pattern does to one tensor beyond its activation inputs: its output or its
    bias. Build with :meth:`quantized`, :meth:`shared`, :meth:`fixed` or :data:`FLOAT`.

    - ``quantized``: observed and quantized with its own qparams (``tensor`` says how);
    - ``shared``: takes the qparams of activation input ``input`` of the anchor op;
    - ``fixed``: fixed ``scale`` / ``zero_point`` (``tensor`` gives dtype and range);
    - ``float``: left in floating point.
    """

    kind: str
    tensor: TensorQuant | None = None
    input: int | None = None
    scale: float | None = None
    zero_point: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _QUANT_KINDS:
            raise ValueError(f"Quant: kind must be one of {', '.join(_QUANT_KINDS)}; got {self.kind!r}")
        needs = {
            "quantized": ("tensor",),
            "shared": ("input",),
            "fixed": ("tensor", "scale", "zero_point"),
            "float": (),
        }[self.kind]
        for name in ("tensor", "input", "scale", "zero_point"):
            value = getattr(self, name)
            if (name in needs) != (value is not None):
                raise ValueError(
                    f"Quant({self.kind}): {name} is {'required' if name in needs else 'not used'}; got {value!r}"
                )
        if self.tensor is not None and not isinstance(self.tensor, TensorQuant):
            raise ValueError(f"Quant({self.kind}): tensor must be a TensorQuant; got {self.tensor!r}")
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"Quant(fixed): scale must be positive; got {self.scale!r}")

    @classmethod
    def quantized(cls, tensor: TensorQuant) -> Quant:
        return cls("quantized", tensor=tensor)

    @classmethod
    def shared(cls, input: int = 0) -> Quant:
        return cls("shared", input=input)

    @classmethod
    def fixed(cls, scale: float, zero_point: int, tensor: TensorQuant) -> Quant:
        return cls("fixed", tensor=tensor, scale=float(scale), zero_point=int(zero_point))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "tensor": None if self.tensor is None else self.tensor.to_dict(),
            "input": self.input,
            "scale": self.scale,
            "zero_point": self.zero_point,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Quant:
        tensor = data.get("tensor")
        return cls(
            data["kind"],
            None if tensor is None else TensorQuant(**tensor),
            data.get("input"),
            data.get("scale"),
            data.get("zero_point"),
        )

    def __str__(self) -> str:
        if self.kind == "quantized":
            return f"own {self.tensor}"
        if self.kind == "shared":
            return f"shared with input {self.input}"
        if self.kind == "fixed":
            return f"fixed scale={self.scale:g} zero_point={self.zero_point} {self.tensor}"
        return "float"


#: A tensor left in floating point.
FLOAT = Quant("float")


@dataclass(frozen=True, order=True)
class Capability:
    """One supported (pattern, mode): what the quantizer does to the whole pattern.

    - ``activation``: the pattern's activation inputs (None for weight-only);
    - ``weight``: its weight (None for weight-less patterns such as add or cat);
    - ``output``: the output of the pattern's last op (:class:`Quant`: own qparams, shared
      with an input, fixed, or ``FLOAT``); dynamic and weight-only outputs are float or
      shared with an input (its run-time qparams), never quantized on their own;
    - ``bias``: its bias (:class:`Quant`: ``FLOAT`` or ``Quant.quantized(...)``);
    - ``fused``: True when the pattern's ops run as one quantized unit (no quantize /
      dequantize between them), False when each op is quantized on its own;
    - ``input_from``: ``"own"`` when the pattern is quantized only where its input comes
      from one of this quantizer's own patterns, ``"any"`` where any quantizer quantized
      its producer, None when it does not depend on its producer;
    - ``plugin`` / ``quantizer``: provenance, filled in by the registry;
    - ``source``: ``"declared"`` (stated by the quantizer or its plugin) or ``"derived"``
      (read off what a quantizer declaring none annotated on the conformance probes; see
      :func:`derive_capabilities`).

    ``output``, ``bias`` and ``fused`` left None are unstated (plugin API 1 declarations
    could not state them); the conformance kit checks every field that is stated.
    """

    pattern: str
    mode: Mode
    activation: TensorQuant | None = None
    weight: TensorQuant | None = None
    plugin: str = ""
    quantizer: str = ""
    ops: tuple[str, ...] = field(default=(), compare=False)
    notes: str = field(default="", compare=False)
    output: Quant | None = None
    bias: Quant | None = None
    fused: bool | None = None
    input_from: str | None = None
    source: str = field(default="declared", compare=False)

    def __post_init__(self) -> None:
        if self.source not in ("declared", "derived"):
            raise ValueError(f"Capability: source is 'declared' or 'derived'; got {self.source!r}")
        if not isinstance(self.pattern, str) or not PATTERN_NAME.match(self.pattern):
            raise ValueError(f"Capability: pattern must be a pattern name like 'conv2d_relu'; got {self.pattern!r}")
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            modes = ", ".join(m.value for m in Mode)
            raise ValueError(f"Capability {self.pattern!r}: mode must be one of {modes}; got {self.mode!r}") from None
        # a pattern outside the core vocabulary is one a plugin contributes: the registry
        # checks that it is contributed and fills in its ops
        if not self.ops and self.pattern in PATTERNS:
            object.__setattr__(self, "ops", PATTERNS[self.pattern][1])
        object.__setattr__(self, "ops", tuple(self.ops))
        if self.mode is Mode.WEIGHT_ONLY and self.activation is not None:
            raise ValueError(f"Capability {self.pattern!r}: weight_only declares no activation quantization")
        if self.mode is not Mode.WEIGHT_ONLY and self.activation is None:
            raise ValueError(f"Capability {self.pattern!r}: mode {self.mode} needs an activation TensorQuant")
        for name in ("output", "bias"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Quant):
                raise ValueError(f"Capability {self.pattern!r}: {name} must be a Quant (or None); got {value!r}")
        if self.bias is not None and self.bias.kind not in ("quantized", "float"):
            raise ValueError(f"Capability {self.pattern!r}: bias is quantized or float; got {self.bias.kind}")
        run_time = self.mode in (Mode.DYNAMIC, Mode.WEIGHT_ONLY)
        if run_time and self.output is not None and self.output.kind not in ("float", "shared"):
            raise ValueError(
                f"Capability {self.pattern!r}: in mode {self.mode} an output stays float or shares its "
                f"input's run-time qparams; got {self.output}"
            )
        if self.input_from not in (None, "own", "any"):
            raise ValueError(
                f"Capability {self.pattern!r}: input_from is 'own' (only after this quantizer's own patterns), "
                f"'any' (after any quantized producer) or None (always); got {self.input_from!r}"
            )
        if self.fused is not None and not isinstance(self.fused, bool):
            raise ValueError(f"Capability {self.pattern!r}: fused must be a bool (or None); got {self.fused!r}")

    @property
    def key(self) -> tuple[str, Mode]:
        """What two capabilities compete for: the same pattern in the same mode."""
        return (self.pattern, self.mode)

    def with_provenance(self, plugin: str, quantizer: str) -> Capability:
        return replace(self, plugin=plugin, quantizer=quantizer)

    def describe(self) -> dict[str, str]:
        """The fields as a person reads them (the CLI's detailed table)."""
        return {
            "activation": "-" if self.activation is None else str(self.activation),
            "weight": "-" if self.weight is None else str(self.weight),
            "bias": "?" if self.bias is None else str(self.bias),
            "output": "?" if self.output is None else str(self.output),
            "fused": "?" if self.fused is None else ("yes" if self.fused else "no"),
            "when": {None: "always", "own": "after its own patterns", "any": "after a quantized producer"}[
                self.input_from
            ],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "mode": self.mode.value,
            "activation": None if self.activation is None else self.activation.to_dict(),
            "weight": None if self.weight is None else self.weight.to_dict(),
            "output": None if self.output is None else self.output.to_dict(),
            "bias": None if self.bias is None else self.bias.to_dict(),
            "fused": self.fused,
            "input_from": self.input_from,
            "ops": list(self.ops),
            "plugin": self.plugin,
            "quantizer": self.quantizer,
            "notes": self.notes,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Capability:
        def tq(value: Any) -> TensorQuant | None:
            return None if value is None else TensorQuant(**value)

        def quant(value: Any) -> Quant | None:
            return None if value is None else Quant.from_dict(value)

        return cls(
            pattern=data["pattern"],
            mode=Mode(data["mode"]),
            activation=tq(data.get("activation")),
            weight=tq(data.get("weight")),
            plugin=data.get("plugin", ""),
            quantizer=data.get("quantizer", ""),
            ops=tuple(data.get("ops", ())),
            notes=data.get("notes", ""),
            output=quant(data.get("output")),
            bias=quant(data.get("bias")),
            fused=data.get("fused"),
            input_from=data.get("input_from"),
            source=data.get("source", "declared"),
        )


def sort_capabilities(caps: Iterable[Capability]) -> list[Capability]:
    return sorted(caps, key=lambda c: (c.pattern, c.mode.value, c.plugin, c.quantizer))


def capability_sort_key(cap: Capability) -> tuple[str, str, str, str, str]:
    """A total order over capabilities (their fields may be None, which ``<`` cannot order)."""
    return (cap.pattern, cap.mode.value, cap.plugin, cap.quantizer, repr(cap))


# shown as where users import them from
for _cls in (Mode, TensorQuant, Quant, Capability):
    _cls.__module__ = "quantweave.capabilities"

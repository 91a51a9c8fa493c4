"""Declared capabilities: which patterns a quantizer supports, in which mode, with which dtypes.

A :class:`Capability` is one record per (pattern, mode). Patterns are named from a fixed,
documented vocabulary (:data:`PATTERNS`), so declarations from different plugins can be
compared and merged. Records are frozen, ordered and JSON-serialisable
(:meth:`Capability.to_dict` / :meth:`Capability.from_dict`).

Capabilities are *tested truths*: ``quantweave.testing.conformance`` builds a probe model
for every declared pattern, runs the quantizer, and fails when what is annotated differs
from what is declared.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

__all__ = [
    "Capability",
    "Mode",
    "PATTERNS",
    "PatternSpec",
    "TensorQuant",
    "core_patterns",
    "tensor_quant_from_spec",
]


class Mode(str, enum.Enum):
    """How a pattern is quantized."""

    STATIC = "static"  # calibrated activation and weight qparams (PTQ)
    DYNAMIC = "dynamic"  # activation qparams computed at run time
    QAT = "qat"  # fake-quantize during training
    WEIGHT_ONLY = "weight_only"  # weights quantized, activations float

    def __str__(self) -> str:
        return self.value


#: The pattern vocabulary: canonical name -> (description, the aten ops that anchor it).
#: The ops are what a quantizer is expected to annotate for the pattern.
PATTERNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "conv1d": ("1-D convolution", ("aten.conv1d.default",)),
    "conv1d_relu": ("1-D convolution followed by relu", ("aten.conv1d.default", "aten.relu.default")),
    "conv2d": ("2-D convolution", ("aten.conv2d.default",)),
    "conv2d_relu": ("2-D convolution followed by relu", ("aten.conv2d.default", "aten.relu.default")),
    "conv2d_hardtanh": ("2-D convolution followed by hardtanh", ("aten.conv2d.default", "aten.hardtanh.default")),
    "conv2d_relu6": (
        "2-D convolution followed by relu6",
        ("aten.conv2d.default", "aten.relu6.default", "aten.hardtanh.default"),
    ),
    "conv2d_hardswish": ("2-D convolution followed by hardswish", ("aten.conv2d.default", "aten.hardswish.default")),
    "conv2d_silu": ("2-D convolution followed by silu", ("aten.conv2d.default", "aten.silu.default")),
    "conv2d_add": (
        "2-D convolution whose output is added to another tensor",
        ("aten.conv2d.default", "aten.add.Tensor"),
    ),
    "conv2d_add_relu": (
        "2-D convolution, add, relu",
        ("aten.conv2d.default", "aten.add.Tensor", "aten.relu.default"),
    ),
    "conv2d_bn": (
        "2-D convolution followed by batch norm (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default"),
    ),
    "conv2d_bn_relu": (
        "2-D convolution, batch norm, relu (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.relu.default"),
    ),
    "conv2d_bn_hardtanh": (
        "2-D convolution, batch norm, hardtanh (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.hardtanh.default"),
    ),
    "conv2d_bn_relu6": (
        "2-D convolution, batch norm, relu6 (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.relu6.default", "aten.hardtanh.default"),
    ),
    "conv2d_bn_hardswish": (
        "2-D convolution, batch norm, hardswish (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.hardswish.default"),
    ),
    "conv2d_bn_silu": (
        "2-D convolution, batch norm, silu (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.silu.default"),
    ),
    "conv2d_bn_add": (
        "2-D convolution, batch norm, add of another tensor (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.add.Tensor"),
    ),
    "conv2d_bn_add_relu": (
        "2-D convolution, batch norm, add, relu (QAT)",
        ("aten.conv2d.default", "aten.batch_norm.default", "aten.add.Tensor", "aten.relu.default"),
    ),
    "conv_transpose2d": ("2-D transposed convolution", ("aten.conv_transpose2d.input",)),
    "conv_transpose2d_relu": (
        "2-D transposed convolution followed by relu",
        ("aten.conv_transpose2d.input", "aten.relu.default"),
    ),
    "conv_transpose2d_bn": (
        "2-D transposed convolution followed by batch norm (QAT)",
        ("aten.conv_transpose2d.input", "aten.batch_norm.default"),
    ),
    "conv_transpose2d_bn_relu": (
        "2-D transposed convolution, batch norm, relu (QAT)",
        ("aten.conv_transpose2d.input", "aten.batch_norm.default", "aten.relu.default"),
    ),
    "linear": ("fully connected layer", ("aten.linear.default",)),
    "linear_relu": ("linear followed by relu", ("aten.linear.default", "aten.relu.default")),
    "linear_leaky_relu": ("linear followed by leaky_relu", ("aten.linear.default", "aten.leaky_relu.default")),
    "linear_tanh": ("linear followed by tanh", ("aten.linear.default", "aten.tanh.default")),
    "linear_gelu": ("linear followed by gelu", ("aten.linear.default", "aten.gelu.default")),
    "linear_add": ("linear whose output is added to another tensor", ("aten.linear.default", "aten.add.Tensor")),
    "linear_add_relu": ("linear, add, relu", ("aten.linear.default", "aten.add.Tensor", "aten.relu.default")),
    "matmul": ("matrix product of two activations", ("aten.matmul.default",)),
    "add": ("elementwise add of two tensors", ("aten.add.Tensor",)),
    "add_relu": ("add followed by relu", ("aten.add.Tensor", "aten.relu.default")),
    "mul": ("elementwise multiply of two tensors", ("aten.mul.Tensor",)),
    "mul_relu": ("multiply followed by relu", ("aten.mul.Tensor", "aten.relu.default")),
    "cat": ("concatenation (probe: two convs into cat)", ("aten.cat.default",)),
    "max_pool2d": ("2-D max pooling", ("aten.max_pool2d.default",)),
    "avg_pool2d": ("2-D average pooling", ("aten.avg_pool2d.default",)),
    "adaptive_avg_pool2d": ("2-D adaptive average pooling", ("aten.adaptive_avg_pool2d.default",)),
    "flatten": ("flatten (probe: conv → flatten → linear)", ("aten.flatten.using_ints",)),
    "mean": ("mean over dimensions (probe: conv → mean over H, W)", ("aten.mean.dim",)),
    "permute": ("permute (probe: conv → permute)", ("aten.permute.default",)),
    "transpose": ("transpose (probe: conv → transpose)", ("aten.transpose.int",)),
    "view": ("view (probe: conv → view)", ("aten.view.default",)),
    "reshape": ("reshape (probe: conv → reshape)", ("aten.reshape.default",)),
    "squeeze": ("squeeze of a dimension (probe: conv → squeeze)", ("aten.squeeze.dim",)),
    "slice": ("slice along a dimension (probe: conv → channel slice)", ("aten.slice.Tensor",)),
    "dropout": ("dropout (kept by export; identity in eval) (probe: conv → dropout)", ("aten.dropout.default",)),
    "relu": ("standalone relu", ("aten.relu.default",)),
    "hardtanh": ("standalone hardtanh", ("aten.hardtanh.default",)),
    "sigmoid": ("sigmoid (fixed output qparams)", ("aten.sigmoid.default",)),
    "softmax": ("softmax (fixed output qparams)", ("aten.softmax.int",)),
    "embedding": ("embedding table lookup (weight)", ("aten.embedding.default",)),
}

_PATTERN_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+$")

#: A probe: a factory of (model, example inputs) containing one instance of a pattern.
ProbeFactory = Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]


@dataclass(frozen=True)
class PatternSpec:
    """One pattern of the vocabulary: a name, what it is, the aten ops that anchor it
    (the first is the anchor the conformance kit checks), and a probe model factory.

    Core patterns have ``origin="core"``; a plugin contributes its own through the
    ``quantweave_patterns`` hook (plugin API 2) and the registry sets ``origin`` to the
    plugin's name. Ops are written ``"<namespace>.<op>.<overload>"`` (``"aten.conv3d.default"``).
    """

    name: str
    description: str
    ops: tuple[str, ...]
    probe: ProbeFactory | None = field(default=None, compare=False)
    origin: str = "core"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _PATTERN_NAME.match(self.name):
            raise ValueError(
                f"PatternSpec: name must be lower-case letters, digits and '_', starting with a letter; "
                f"got {self.name!r}"
            )
        ops = tuple(self.ops) if isinstance(self.ops, (list, tuple)) else None
        if not ops or not all(isinstance(op, str) and _OP_NAME.match(op) for op in ops):
            raise ValueError(
                f"PatternSpec {self.name!r}: ops must be a non-empty sequence of op names like "
                f"'aten.conv3d.default'; got {self.ops!r}"
            )
        object.__setattr__(self, "ops", ops)
        if self.probe is not None and not callable(self.probe):
            raise ValueError(f"PatternSpec {self.name!r}: probe must be a callable; got {self.probe!r}")

    @property
    def anchor(self) -> str:
        return self.ops[0]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "ops": list(self.ops), "origin": self.origin}


def core_patterns() -> dict[str, PatternSpec]:
    """The core vocabulary as :class:`PatternSpec` records, probes included."""
    from .testing.conformance import PROBES

    return {
        name: PatternSpec(name, description, ops, PROBES.get(name)) for name, (description, ops) in PATTERNS.items()
    }


_GRANULARITIES = ("per_tensor", "per_channel", "per_channel_float_qparams")
_DTYPES = ("uint8", "int8", "uint16", "int16", "int32")


@dataclass(frozen=True, order=True)
class TensorQuant:
    """How one tensor (activation or weight) is quantized."""

    dtype: str
    quant_min: int
    quant_max: int
    granularity: str = "per_tensor"
    symmetric: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"TensorQuant: dtype must be one of {', '.join(_DTYPES)}; got {self.dtype!r}")
        if self.granularity not in _GRANULARITIES:
            raise ValueError(
                f"TensorQuant: granularity must be one of {', '.join(_GRANULARITIES)}; got {self.granularity!r}"
            )
        info = torch.iinfo(getattr(torch, self.dtype))
        if not info.min <= self.quant_min <= self.quant_max <= info.max:
            raise ValueError(
                f"TensorQuant: expected {info.min} <= quant_min <= quant_max <= {info.max} for {self.dtype}; "
                f"got quant_min={self.quant_min}, quant_max={self.quant_max}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "quant_min": self.quant_min,
            "quant_max": self.quant_max,
            "granularity": self.granularity,
            "symmetric": self.symmetric,
        }

    def __str__(self) -> str:
        kind = "sym" if self.symmetric else "affine"
        return f"{self.dtype}[{self.quant_min},{self.quant_max}] {self.granularity} {kind}"


def tensor_quant_from_spec(spec: Any) -> TensorQuant | None:
    """The :class:`TensorQuant` a ``QuantizationSpec``-like object describes (None if not one)."""
    dtype = getattr(spec, "dtype", None)
    if not isinstance(dtype, torch.dtype) or not hasattr(spec, "quant_min"):
        return None
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        return None
    info = torch.iinfo(dtype)
    qmin = info.min if spec.quant_min is None else spec.quant_min
    qmax = info.max if spec.quant_max is None else spec.quant_max
    qscheme = getattr(spec, "qscheme", None)
    if qscheme == torch.per_channel_affine_float_qparams:
        granularity = "per_channel_float_qparams"
    elif qscheme in (torch.per_channel_affine, torch.per_channel_symmetric):
        granularity = "per_channel"
    else:
        granularity = "per_tensor"
    symmetric = qscheme in (torch.per_tensor_symmetric, torch.per_channel_symmetric)
    return TensorQuant(name, int(qmin), int(qmax), granularity, symmetric)


@dataclass(frozen=True, order=True)
class Capability:
    """One supported (pattern, mode), with the quantization applied and who provides it.

    ``activation`` describes the pattern's input activation (None for weight-only);
    ``weight`` its weight (None for weight-less patterns such as add or cat).
    ``plugin``/``quantizer`` are filled in by the registry (provenance).
    """

    pattern: str
    mode: Mode
    activation: TensorQuant | None = None
    weight: TensorQuant | None = None
    plugin: str = ""
    quantizer: str = ""
    ops: tuple[str, ...] = field(default=(), compare=False)
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not _PATTERN_NAME.match(self.pattern):
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

    @property
    def key(self) -> tuple[str, Mode]:
        """What two capabilities compete for: the same pattern in the same mode."""
        return (self.pattern, self.mode)

    def with_provenance(self, plugin: str, quantizer: str) -> Capability:
        return replace(self, plugin=plugin, quantizer=quantizer)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "mode": self.mode.value,
            "activation": None if self.activation is None else self.activation.to_dict(),
            "weight": None if self.weight is None else self.weight.to_dict(),
            "ops": list(self.ops),
            "plugin": self.plugin,
            "quantizer": self.quantizer,
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Capability:
        def tq(value: Any) -> TensorQuant | None:
            return None if value is None else TensorQuant(**value)

        return cls(
            pattern=data["pattern"],
            mode=Mode(data["mode"]),
            activation=tq(data.get("activation")),
            weight=tq(data.get("weight")),
            plugin=data.get("plugin", ""),
            quantizer=data.get("quantizer", ""),
            ops=tuple(data.get("ops", ())),
            notes=data.get("notes", ""),
        )


def sort_capabilities(caps: Iterable[Capability]) -> list[Capability]:
    return sorted(caps, key=lambda c: (c.pattern, c.mode.value, c.plugin, c.quantizer))

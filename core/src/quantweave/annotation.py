"""The PT2E annotation API: how a quantizer says *what* to quantize and *how*.

A quantizer walks the exported graph and stores a :class:`QuantizationAnnotation`
in ``node.meta["quantization_annotation"]``. The annotation maps each input edge
``(producer, node)`` and the node's output to a *spec*:

* :class:`QuantizationSpec` -- observe the tensor and derive qparams from the data;
* :class:`FixedQParamsQuantizationSpec` -- qparams are known up front (sigmoid, softmax);
* :class:`SharedQuantizationSpec` -- use the same observer (and qparams) as another edge/node;
* :class:`DerivedQuantizationSpec` -- qparams computed from other observers (e.g. int32 bias).

Names and semantics follow the PyTorch PT2E tutorials, so quantizers written for
``torch.ao.quantization.quantizer`` / ``torchao.quantization.pt2e.quantizer`` port by
changing import paths only. Every spec validates itself on construction and raises
:class:`ValueError` with what was expected and what was got.
"""

from __future__ import annotations

import math
from abc import ABC
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node

from ._modules.qtypes import (
    FLOAT8_DTYPES,
    INTEGER_DTYPES,
    PLACEHOLDER_DTYPES,
    QSCHEMES,
    dtype_range,
    float8_range,
    is_float8_dtype,
    is_integer_dtype,
    is_per_channel,
    is_per_tensor,
    is_placeholder_dtype,
)

__all__ = [
    "ANNOTATION_KEY",
    "EdgeOrNode",
    "QuantizationSpecBase",
    "QuantizationSpec",
    "FixedQParamsQuantizationSpec",
    "SharedQuantizationSpec",
    "DerivedQuantizationSpec",
    "QuantizationAnnotation",
    "QuantizationConfig",
    "get_input_act_qspec",
    "get_output_act_qspec",
    "get_weight_qspec",
    "get_bias_qspec",
    "annotate_input_qspec_map",
    "annotate_output_qspec",
    "is_annotated",
    "mark_annotated",
    "set_skip_reason",
    "ANNOTATED_BY_KEY",
    "SKIP_REASON_KEY",
]

# -- the annotation protocol: the node.meta keys quantizers, prepare, compose and the report share

#: ``node.meta`` key holding a node's :class:`QuantizationAnnotation` (same key as PT2E).
ANNOTATION_KEY = "quantization_annotation"
#: ``node.meta`` key where a quantizer records, as a string, why it left a node float
#: (written with :func:`set_skip_reason`; read by :func:`quantweave.annotation_report`).
SKIP_REASON_KEY = "quantweave_skip_reason"
#: ``node.meta`` key naming the quantizer that claimed the node (written by
#: :func:`mark_annotated` and by ``ComposableQuantizer`` for its members).
ANNOTATED_BY_KEY = "quantweave_annotated_by"

#: An input edge ``(producer, consumer)`` or a node (meaning: that node's output).
EdgeOrNode = tuple[Node, Node] | Node

# The dtype and qscheme tables live in quantweave._modules.qtypes, once for the engine
# (these names are aliases for the code below that still uses them).


def _dtype_names() -> str:
    return ", ".join(str(d) for d in INTEGER_DTYPES)


def _check_range(kind: str, dtype: Any, quant_min: int | None, quant_max: int | None) -> None:
    if not is_integer_dtype(dtype):
        raise ValueError(f"{kind}: dtype must be one of {_dtype_names()}; got {dtype!r}")
    lo, hi = dtype_range(dtype)
    for name, value in (("quant_min", quant_min), ("quant_max", quant_max)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{kind}: {name} must be an int or None; got {value!r}")
        if not lo <= value <= hi:
            raise ValueError(f"{kind}: {name}={value} is outside the range of {dtype} [{lo}, {hi}]")
    if quant_min is not None and quant_max is not None and quant_min > quant_max:
        raise ValueError(f"{kind}: expected quant_min <= quant_max; got quant_min={quant_min}, quant_max={quant_max}")


def _check_spec_dtype(kind: str, dtype: Any, quant_min: Any, quant_max: Any, is_dynamic: Any) -> None:
    """A :class:`QuantizationSpec`'s dtype: an integer dtype, a float8 dtype (quantized: the
    rounded values stored as float8, bounds within the dtype's finite range), or a float
    *placeholder* dtype (float32 / float16 / bfloat16: nothing is quantized -- the PT2E
    tutorials' ``QuantizationSpec(dtype=torch.float, observer_or_fake_quant_ctr=PlaceholderObserver)``)."""
    if is_integer_dtype(dtype):
        _check_range(kind, dtype, quant_min, quant_max)
        return
    if not (is_float8_dtype(dtype) or is_placeholder_dtype(dtype)):
        names = ", ".join(str(d) for d in (*INTEGER_DTYPES, *FLOAT8_DTYPES, *PLACEHOLDER_DTYPES))
        raise ValueError(f"{kind}: dtype must be one of {names}; got {dtype!r}")
    if is_dynamic:
        raise ValueError(
            f"{kind}: dynamic quantization chooses integer qparams at run time, so it needs an integer dtype "
            f"({_dtype_names()}); got dtype={dtype} with is_dynamic=True"
        )
    for name, value in (("quant_min", quant_min), ("quant_max", quant_max)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{kind}: {name} must be an int or None; got {value!r}")
    if is_float8_dtype(dtype):
        lo, hi = float8_range(dtype)
        for name, value in (("quant_min", quant_min), ("quant_max", quant_max)):
            if value is not None and not lo <= value <= hi:
                raise ValueError(f"{kind}: {name}={value} is outside the finite range of {dtype} [{lo}, {hi}]")
    if quant_min is not None and quant_max is not None and quant_min > quant_max:
        raise ValueError(f"{kind}: expected quant_min <= quant_max; got quant_min={quant_min}, quant_max={quant_max}")


def _check_qscheme(kind: str, qscheme: Any, ch_axis: Any) -> None:
    """A known qscheme (or None). A per-channel qscheme may leave ``ch_axis`` None: the
    observer's own default axis applies (0 for torch's per-channel observers), as in torchao."""
    if ch_axis is not None and (isinstance(ch_axis, bool) or not isinstance(ch_axis, int)):
        # a negative axis counts from the end; prepare checks it against the tensor's dimensions
        raise ValueError(f"{kind}: ch_axis must be an int or None; got {ch_axis!r}")
    if qscheme is None:
        return
    if qscheme not in QSCHEMES:
        names = ", ".join(str(q) for q in QSCHEMES)
        raise ValueError(f"{kind}: qscheme must be one of {names}; got {qscheme!r}")


def _check_group(
    kind: str, group_size: Any, qscheme: Any, ch_axis: int | None, is_dynamic: bool, dtype: Any = torch.int8
) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"{kind}: group_size must be an int >= 2 (or None); got {group_size!r}")
    if not is_integer_dtype(dtype):
        raise ValueError(f"{kind}: group-wise quantization needs an integer dtype ({_dtype_names()}); got {dtype}")
    if qscheme not in (torch.per_channel_symmetric, torch.per_channel_affine):
        raise ValueError(
            f"{kind}: group_size={group_size} needs qscheme torch.per_channel_symmetric or torch.per_channel_affine "
            f"(qparams per row and group); got qscheme={qscheme}"
        )
    if ch_axis not in (0, None):
        raise ValueError(
            f"{kind}: group-wise quantization takes qparams per row of a 2-D tensor (groups run along the row), "
            f"so ch_axis must be 0; got ch_axis={ch_axis}"
        )
    if is_dynamic:
        raise ValueError(f"{kind}: group-wise quantization is static (weights); got is_dynamic=True")


#: the only range ``quantized_decomposed.choose_qparams_per_token_asymmetric`` chooses qparams for
PER_TOKEN_RANGE = (-128, 127)


def _check_per_token(
    kind: str, per_token: Any, dtype: Any, quant_min: int | None, quant_max: int | None, qscheme: Any, is_dynamic: bool
) -> None:
    if not isinstance(per_token, bool):
        raise ValueError(f"{kind}: per_token must be a bool; got {per_token!r}")
    if not per_token:
        return
    if not is_dynamic:  # so also never group-wise: group_size needs a static spec
        raise ValueError(
            f"{kind}: per_token=True quantizes each token with qparams chosen at run time, so it needs "
            f"is_dynamic=True; got is_dynamic={is_dynamic!r}"
        )
    if qscheme not in (None, torch.per_tensor_affine):
        raise ValueError(
            f"{kind}: per_token=True takes an asymmetric (scale, zero point) per token: qscheme must be "
            f"torch.per_tensor_affine or None; got qscheme={qscheme}"
        )
    lo, hi = PER_TOKEN_RANGE
    if dtype != torch.int8 or quant_min not in (None, lo) or quant_max not in (None, hi):
        raise ValueError(
            f"{kind}: per_token=True is int8 in [{lo}, {hi}] (the range choose_qparams_per_token_asymmetric "
            f"chooses for); got dtype={dtype}, quant_min={quant_min!r}, quant_max={quant_max!r}"
        )


def _check_edge_or_node(kind: str, value: Any) -> None:
    if isinstance(value, Node):
        return
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, Node) for v in value):
        return
    raise ValueError(f"{kind}: expected a torch.fx.Node or an input edge (producer Node, consumer Node); got {value!r}")


class QuantizationSpecBase(ABC):  # noqa: B024 - a marker base, as in PT2E
    """Base of all specs. Subclasses are frozen dataclasses (hashable, comparable)."""


@dataclass(eq=True, frozen=True)
class QuantizationSpec(QuantizationSpecBase):
    """Observe a tensor and quantize it with qparams calculated from what was observed.

    ``observer_or_fake_quant_ctr`` is an observer (PTQ) or fake-quantize (QAT) class or
    ``.with_args(...)`` partial; the other fields are passed to it on construction.
    ``quant_min``/``quant_max`` default to the full range of ``dtype``.

    ``dtype`` is an integer dtype, a float8 dtype (``torch.float8_e4m3fn`` / ``float8_e5m2``:
    scale and zero point as for an integer dtype, the rounded values stored as float8; give
    ``quant_min``/``quant_max`` within its finite range, e.g. ``int(torch.finfo(dtype).min)``),
    or a float *placeholder* dtype -- ``torch.float32``, ``torch.bfloat16`` (the tensor is left
    float) or ``torch.float16`` (rounded through float16 and back) -- usually with a
    ``PlaceholderObserver``, as the PT2E tutorials write an unquantized bias. A per-channel
    ``qscheme`` with ``ch_axis`` left None takes the observer's default axis (0 for torch's
    per-channel observers).

    ``group_size`` (quantweave's addition; None, the default, is PT2E's spec unchanged)
    makes a per-channel spec group-wise: a 2-D tensor gets qparams per row (``ch_axis=0``)
    and per run of ``group_size`` consecutive elements along the row, and is converted to
    ``quantize_per_channel_group`` / ``dequantize_per_channel_group``. It needs a
    per-channel qscheme (``per_channel_symmetric`` or ``per_channel_affine``), ``ch_axis=0``,
    a static spec, and an observer that takes ``group_size``
    (:class:`quantweave.observers.PerGroupMinMaxObserver`).

    ``per_token`` (quantweave's addition; False, the default, is PT2E's spec unchanged) makes
    a dynamic spec take one (scale, zero point) per token -- per row over the last dimension
    -- chosen at run time, instead of one for the whole tensor. It is converted to
    ``choose_qparams_per_token_asymmetric`` -> ``quantize_per_token`` ->
    ``dequantize_per_token`` (what XNNPACK's dynamically quantized linear computes). It
    needs ``is_dynamic=True``, ``dtype=torch.int8`` with the full range [-128, 127] (the
    range the choose op computes for), ``qscheme`` ``torch.per_tensor_affine`` or None (so no
    ``group_size``: group-wise specs are static), and post-training preparation (``prepare_pt2e``); the observer is not
    consulted (a ``PlaceholderObserver`` as for any dynamic spec).
    """

    dtype: torch.dtype
    observer_or_fake_quant_ctr: Callable[..., Any]
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: torch.qscheme | None = None
    ch_axis: int | None = None
    is_dynamic: bool = False
    group_size: int | None = None
    per_token: bool = False

    def __post_init__(self) -> None:
        kind = "QuantizationSpec"
        _check_spec_dtype(kind, self.dtype, self.quant_min, self.quant_max, self.is_dynamic)
        _check_qscheme(kind, self.qscheme, self.ch_axis)
        if self.group_size is not None:
            _check_group(kind, self.group_size, self.qscheme, self.ch_axis, self.is_dynamic, self.dtype)
        _check_per_token(
            kind, self.per_token, self.dtype, self.quant_min, self.quant_max, self.qscheme, self.is_dynamic
        )
        if not callable(self.observer_or_fake_quant_ctr):
            raise ValueError(
                f"{kind}: observer_or_fake_quant_ctr must be callable (an observer class or "
                f"its .with_args(...)); got {self.observer_or_fake_quant_ctr!r}"
            )
        if self.is_dynamic and is_per_channel(self.qscheme):
            raise ValueError(
                f"{kind}: dynamic quantization supports per-tensor qschemes only; got qscheme={self.qscheme}"
            )


@dataclass(eq=True, frozen=True)
class FixedQParamsQuantizationSpec(QuantizationSpecBase):
    """Quantize with a known ``scale`` and ``zero_point`` (e.g. sigmoid: 1/256, 0)."""

    dtype: torch.dtype
    scale: float
    zero_point: int
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: torch.qscheme | None = None
    is_dynamic: bool = False

    def __post_init__(self) -> None:
        kind = "FixedQParamsQuantizationSpec"
        _check_range(kind, self.dtype, self.quant_min, self.quant_max)
        _check_qscheme(kind, self.qscheme, None)
        if is_per_channel(self.qscheme):
            raise ValueError(f"{kind}: qscheme must be per-tensor; got {self.qscheme}")
        if not isinstance(self.scale, (int, float)) or not 0 < self.scale < math.inf:
            finite = " (not finite)" if self.scale == math.inf else ""
            raise ValueError(f"{kind}: scale must be a positive number; got {self.scale!r}{finite}")
        lo, hi = dtype_range(self.dtype)
        lo = lo if self.quant_min is None else self.quant_min
        hi = hi if self.quant_max is None else self.quant_max
        if isinstance(self.zero_point, bool) or not isinstance(self.zero_point, int):
            raise ValueError(f"{kind}: zero_point must be an int; got {self.zero_point!r}")
        if not lo <= self.zero_point <= hi:
            raise ValueError(f"{kind}: zero_point={self.zero_point} is outside [quant_min, quant_max] = [{lo}, {hi}]")
        if self.is_dynamic:
            raise ValueError(f"{kind}: fixed qparams cannot be dynamic; got is_dynamic=True")


@dataclass(eq=True, frozen=True)
class SharedQuantizationSpec(QuantizationSpecBase):
    """Share the observer (and so the qparams) of another input edge or node output."""

    edge_or_node: EdgeOrNode

    def __post_init__(self) -> None:
        _check_edge_or_node("SharedQuantizationSpec", self.edge_or_node)


@dataclass(eq=True, frozen=True)
class DerivedQuantizationSpec(QuantizationSpecBase):
    """qparams computed by ``derive_qparams_fn(observers) -> (scale, zero_point)``.

    ``observers`` are the observers of the edges/nodes in ``derived_from``, in order.
    The classic use: an int32 bias with ``scale = act_scale * weight_scale``.
    """

    derived_from: list[EdgeOrNode]
    derive_qparams_fn: Callable[[list[Any]], tuple[torch.Tensor, torch.Tensor]]
    dtype: torch.dtype
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: torch.qscheme | None = None
    ch_axis: int | None = None
    is_dynamic: bool = False

    def __hash__(self) -> int:  # derived_from is a list; hash by identity of its members
        return hash((tuple(self.derived_from), self.derive_qparams_fn, self.dtype))

    def __post_init__(self) -> None:
        kind = "DerivedQuantizationSpec"
        if not isinstance(self.derived_from, Sequence) or not self.derived_from:
            raise ValueError(f"{kind}: derived_from must be a non-empty list of edges/nodes; got {self.derived_from!r}")
        for item in self.derived_from:
            _check_edge_or_node(kind, item)
        if not callable(self.derive_qparams_fn):
            raise ValueError(f"{kind}: derive_qparams_fn must be callable; got {self.derive_qparams_fn!r}")
        _check_range(kind, self.dtype, self.quant_min, self.quant_max)
        _check_qscheme(kind, self.qscheme, self.ch_axis)
        if self.is_dynamic:
            raise ValueError(f"{kind}: derived qparams cannot be dynamic; got is_dynamic=True")


@dataclass
class QuantizationAnnotation:
    """How one node is quantized: a spec per input edge, a spec for the output.

    ``allow_implicit_sharing``: when True (default) an input edge whose spec equals the
    producer's output spec (or another consumer's edge spec) shares its observer.
    ``_annotated`` marks nodes a quantizer has claimed, so later quantizers skip them.
    """

    input_qspec_map: dict[Node, QuantizationSpecBase | None] = field(default_factory=dict)
    output_qspec: QuantizationSpecBase | None = None
    allow_implicit_sharing: bool = True
    _annotated: bool = False


@dataclass(eq=True, frozen=True)
class QuantizationConfig:
    """The four specs a quantizer usually applies to a weighted op."""

    input_activation: QuantizationSpec | None
    output_activation: QuantizationSpec | None
    weight: QuantizationSpec | None
    bias: QuantizationSpecBase | None
    is_qat: bool = False


def get_input_act_qspec(config: QuantizationConfig | None) -> QuantizationSpec | None:
    """The input-activation spec of ``config`` (None when config is None)."""
    if config is None or config.input_activation is None:
        return None
    spec = config.input_activation
    if spec.qscheme is not None and not is_per_tensor(spec.qscheme):
        raise ValueError(f"input activation spec must be per-tensor; got qscheme={spec.qscheme}")
    return spec


def get_output_act_qspec(config: QuantizationConfig | None) -> QuantizationSpec | None:
    """The output-activation spec of ``config`` (None when config is None)."""
    if config is None or config.output_activation is None:
        return None
    spec = config.output_activation
    if spec.qscheme is not None and not is_per_tensor(spec.qscheme):
        raise ValueError(f"output activation spec must be per-tensor; got qscheme={spec.qscheme}")
    return spec


def get_weight_qspec(config: QuantizationConfig | None) -> QuantizationSpec | None:
    """The weight spec of ``config`` (None when config is None)."""
    if config is None or config.weight is None:
        return None
    spec = config.weight
    if spec.qscheme is not None and spec.qscheme not in QSCHEMES:
        raise ValueError(f"weight spec has an unsupported qscheme: {spec.qscheme}")
    return spec


def get_bias_qspec(config: QuantizationConfig | None) -> QuantizationSpecBase | None:
    """The bias spec of ``config`` (None when config is None)."""
    if config is None:
        return None
    return config.bias


def _annotation_of(node: Node) -> QuantizationAnnotation:
    annotation = node.meta.get(ANNOTATION_KEY)
    if annotation is None:
        annotation = QuantizationAnnotation()
        node.meta[ANNOTATION_KEY] = annotation
    elif not isinstance(annotation, QuantizationAnnotation):
        raise TypeError(
            f"node {node.name!r}: meta[{ANNOTATION_KEY!r}] must be a QuantizationAnnotation; "
            f"got {type(annotation).__name__}"
        )
    return annotation


def annotate_input_qspec_map(node: Node, input_node: Node, qspec: QuantizationSpecBase | None) -> None:
    """Set the spec of input edge ``(input_node, node)``, creating the annotation if needed."""
    if input_node not in node.all_input_nodes:
        raise ValueError(
            f"node {node.name!r}: {input_node.name!r} is not one of its inputs "
            f"({[n.name for n in node.all_input_nodes]})"
        )
    _annotation_of(node).input_qspec_map[input_node] = qspec


def annotate_output_qspec(node: Node, qspec: QuantizationSpecBase | None) -> None:
    """Set the output spec of ``node``, creating the annotation if needed."""
    _annotation_of(node).output_qspec = qspec


def mark_annotated(nodes: Node | Sequence[Node], by: str | None = None) -> None:
    """Claim ``nodes``: later quantizers (and composed members) leave them alone.

    Creates an empty annotation on a node that has none (a node fused into a pattern
    whose quantization specs sit on its neighbours). ``by`` names the quantizer in the
    annotation report; a ``ComposableQuantizer`` fills it in for its members."""
    if isinstance(nodes, Node):
        nodes = [nodes]
    for node in nodes:
        if not isinstance(node, Node):
            raise TypeError(f"mark_annotated expects torch.fx.Node objects; got {type(node).__name__}")
        _annotation_of(node)._annotated = True
        if by is not None:
            node.meta[ANNOTATED_BY_KEY] = by


def set_skip_reason(node: Node, reason: str) -> None:
    """Record why a quantizer left ``node`` float (shown by the annotation report)."""
    if not isinstance(reason, str) or not reason:
        raise TypeError(f"set_skip_reason: reason must be a non-empty string; got {reason!r}")
    node.meta[SKIP_REASON_KEY] = reason


def is_annotated(nodes: Node | Sequence[Node]) -> bool:
    """True if any of ``nodes`` was already claimed by a quantizer (``_annotated``)."""
    if isinstance(nodes, Node):
        nodes = [nodes]
    for node in nodes:
        annotation = node.meta.get(ANNOTATION_KEY)
        if annotation is not None and getattr(annotation, "_annotated", False):
            return True
    return False

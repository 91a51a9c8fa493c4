"""Weight-only embedding quantization: ``aten.embedding`` tables, 8-bit per row or 4-bit group-wise.

Every ``aten.embedding`` (``nn.Embedding`` and ``F.embedding`` export to it) whose table is
a constant 2-D tensor gets its table quantized; the looked-up rows stay float (the op
reads a dequantized table, so nothing is quantized at run time):

- ``EmbeddingConfig(bits=8)``: uint8 with a float scale and zero point per row
  (``per_channel_affine_float_qparams``, axis 0; the spec of torchao's PT2E
  ``EmbeddingQuantizer``), which ExecuTorch's quant fusion turns into ``embedding_byte``;
- ``EmbeddingConfig(bits=4, group_size=32)``: values in [-8, 7] stored in int8, a scale per
  row and group of ``group_size`` elements (symmetric; ``symmetric=False`` adds an integer
  zero point per group). ``quantweave-executorch`` packs them two per byte into
  ExecuTorch's ``embedding_4bit``;
- ``EmbeddingConfig(bits=8, group_size=g)``: int8 per row and group.

Tables to leave float are chosen by module name or module type (``set_module_name("head",
None)``), or by a filter function; each skip is recorded for the annotation report.

Tied tables: when the table's weight is also read by another op (an LM head tied to the
embedding), ``tied="share"`` (default) makes the lookup share that op's quantization if an
earlier quantizer annotated it with a per-row spec (so the table is quantized once, and both
read the same integers); otherwise the table is quantized with its own config.
``tied="own"`` always uses the config; ``tied="skip"`` leaves tied tables float.

Half-precision scales (symmetric group-wise tables: 4-bit, or 8-bit with ``group_size``):
``scale_dtype=torch.float16`` makes every scale a float16 value, rounded up (see
``quantweave_embedding._half``), so a lowering can store them in 2 bytes instead of 4 without
changing an output (``quantweave_executorch.to_executorch`` does). Trade-off: each step grows
by at most 2**-11 (0.05 %); 4-bit tables in groups of 32 take 0.5625 bytes per element instead
of 0.625 (groups of 128: 0.515625 instead of 0.53125).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.authoring import ConfigStage, ConfigStages, attr_value, calls, check_config, tensor_value
from quantweave.observers import PerChannelMinMaxObserver, PerGroupMinMaxObserver
from quantweave.plugin_api import (
    ANNOTATION_KEY,
    Capability,
    TensorQuant,
    mark_annotated,
    set_skip_reason,
    warn_unknown_modules,
)

from ._capabilities import declared_capabilities, weight_tensor_quant
from ._half import HalfScalePerGroupMinMaxObserver

__all__ = ["SCALE_DTYPES", "EmbeddingConfig", "EmbeddingQuantizer"]

#: the dtypes table scales may be stored in (float16: scales rounded up to float16 values)
SCALE_DTYPES = (torch.float32, torch.float16)

_EMBEDDING = torch.ops.aten.embedding.default
_TIED = ("share", "own", "skip")
_PER_ROW = (torch.per_channel_symmetric, torch.per_channel_affine, torch.per_channel_affine_float_qparams)

NodeFilter = Callable[[Node], bool]


@dataclass(frozen=True)
class EmbeddingConfig:
    """How a table is quantized: ``bits`` 8 or 4; ``group_size`` (None: per row, 8-bit only;
    4-bit defaults to 32); ``symmetric`` for group-wise tables (default True: a scale per
    group, no zero point); ``scale_dtype`` torch.float32 (default) or torch.float16 (scales
    that are float16 values, symmetric group-wise tables only; see the module docstring)."""

    bits: int = 8
    group_size: int | None = None
    symmetric: bool | None = None
    scale_dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.bits not in (4, 8) or isinstance(self.bits, bool):
            raise ValueError(f"EmbeddingConfig: bits must be 8 or 4; got {self.bits!r}")
        if self.group_size is not None and (
            isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2
        ):
            raise ValueError(f"EmbeddingConfig: group_size must be an int >= 2 or None; got {self.group_size!r}")
        if self.symmetric is not None and not isinstance(self.symmetric, bool):
            raise ValueError(f"EmbeddingConfig: symmetric must be a bool or None; got {self.symmetric!r}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(
                f"EmbeddingConfig: scale_dtype must be torch.float32 or torch.float16; got {self.scale_dtype!r}"
            )
        if self.scale_dtype == torch.float16 and (self.groups is None or self.symmetric is False):
            raise ValueError(
                "EmbeddingConfig: scale_dtype=torch.float16 is for symmetric group-wise tables (no zero points: "
                "ExecuTorch 1.5.1's kernels cannot read half scales with zero points); got "
                f"bits={self.bits}, group_size={self.group_size}, symmetric={self.symmetric}"
            )
        if self.bits == 8 and self.group_size is None and self.symmetric:
            raise ValueError(
                "EmbeddingConfig: 8-bit per-row tables are uint8 with a float scale and zero point per row (the "
                "embedding_byte form); symmetric=True applies to group-wise tables (give group_size)"
            )

    @property
    def groups(self) -> int | None:
        """The group size actually used (32 for 4-bit tables without one)."""
        return 32 if self.bits == 4 and self.group_size is None else self.group_size

    def tensor_quant(self) -> TensorQuant:
        return weight_tensor_quant(self.bits, self.group_size, self.symmetric)

    def weight_spec(self) -> qw.QuantizationSpec:
        """The ``QuantizationSpec`` of the table."""
        if self.groups is None:
            return qw.QuantizationSpec(
                dtype=torch.uint8,
                qscheme=torch.per_channel_affine_float_qparams,
                ch_axis=0,
                observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=2**-12),
            )
        half = self.scale_dtype == torch.float16
        per_group = HalfScalePerGroupMinMaxObserver if half else PerGroupMinMaxObserver
        tq = self.tensor_quant()
        return qw.QuantizationSpec(
            dtype=torch.int8,
            quant_min=tq.quant_min,
            quant_max=tq.quant_max,
            qscheme=torch.per_channel_symmetric if tq.symmetric else torch.per_channel_affine,
            ch_axis=0,
            group_size=self.groups,
            observer_or_fake_quant_ctr=per_group.with_args(eps=2**-12),
        )


def _table_shape(node: Node) -> tuple[int, ...] | None:
    value = tensor_value(node)
    if value is None:
        value = attr_value(node)
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _per_row_spec(spec: Any) -> bool:
    """A static spec with qparams per row (axis 0) of a table-shaped weight."""
    return (
        isinstance(spec, qw.QuantizationSpec)
        and spec.qscheme in _PER_ROW
        and spec.ch_axis == 0
        and not spec.is_dynamic
        and spec.dtype in (torch.int8, torch.uint8)
    )


class EmbeddingQuantizer(qw.Quantizer):
    """Weight-only quantizer of embedding tables (see the module docstring)::

        EmbeddingQuantizer()  # 8-bit per row (embedding_byte)
        EmbeddingQuantizer(bits=4, group_size=64)  # 4-bit, groups of 64 (embedding_4bit)
        EmbeddingQuantizer(bits=4, scale_dtype=torch.float16)  # scales that are float16 values
        EmbeddingQuantizer().set_module_name("pos", None)  # leave the table of module "pos" float

    ``qw.get_quantizer("embedding", **options)`` and ``qw.get_quantizer("embedding_4bit",
    **options)`` build one. Precedence: module name > module type > global.
    """

    name = "embedding"

    def __init__(
        self,
        bits: int = 8,
        group_size: int | None = None,
        *,
        symmetric: bool | None = None,
        tied: str = "share",
        scale_dtype: torch.dtype = torch.float32,
    ) -> None:
        if tied not in _TIED:
            raise ValueError(f"EmbeddingQuantizer: tied must be one of {', '.join(_TIED)}; got {tied!r}")
        self.global_config: EmbeddingConfig | None = EmbeddingConfig(bits, group_size, symmetric, scale_dtype)
        self.module_name_config: dict[str, EmbeddingConfig | None] = {}
        self.module_type_config: dict[type, EmbeddingConfig | None] = {}
        self.filter_fn: NodeFilter | None = None
        self.tied = tied

    # -- configuration -------------------------------------------------------------------------

    @staticmethod
    def _check(setter: str, config: Any) -> None:
        check_config(setter, config, EmbeddingConfig)

    def set_global(self, config: EmbeddingConfig | None) -> EmbeddingQuantizer:
        """The config of every table no module name or module type config claims (None: none)."""
        self._check("set_global", config)
        self.global_config = config
        return self

    def set_module_name(self, module_name: str, config: EmbeddingConfig | None) -> EmbeddingQuantizer:
        """Config for the tables looked up inside the submodule ``module_name`` (``"tok"``,
        ``"blocks.0"``); ``None`` leaves them float."""
        if not isinstance(module_name, str) or not module_name:
            raise ValueError(f"set_module_name: module_name must be a non-empty str; got {module_name!r}")
        self._check("set_module_name", config)
        self.module_name_config[module_name] = config
        return self

    def set_module_type(self, module_type: type[torch.nn.Module], config: EmbeddingConfig | None) -> EmbeddingQuantizer:
        """Config for the tables looked up inside submodules of type ``module_type``."""
        if not isinstance(module_type, type):
            raise TypeError(f"set_module_type: expected a module class; got {module_type!r}")
        self._check("set_module_type", config)
        self.module_type_config[module_type] = config
        return self

    def set_filter_function(self, filter_fn: NodeFilter | None) -> EmbeddingQuantizer:
        """Quantize only the embeddings for which ``filter_fn(node)`` is true."""
        if filter_fn is not None and not callable(filter_fn):
            raise TypeError(f"set_filter_function: expected a callable or None; got {filter_fn!r}")
        self.filter_fn = filter_fn
        return self

    def _config_for(self, node: Node) -> ConfigStage:
        """Module name > module type > global (the authoring kit's rule; no operator types)."""
        stages = ConfigStages(self.global_config, config_type=EmbeddingConfig)
        stages.module_name.update(self.module_name_config)
        stages.module_type.update(self.module_type_config)
        return stages.covering(node)

    # -- declarations --------------------------------------------------------------------------

    def quantization_capabilities(self) -> tuple[Capability, ...]:
        config = self.global_config
        if config is None:
            return ()
        return declared_capabilities(config.bits, config.group_size, config.symmetric)

    def __repr__(self) -> str:
        return f"EmbeddingQuantizer(global={self.global_config}, tied={self.tied!r})"

    # -- annotation ----------------------------------------------------------------------------

    def annotate(self, model: GraphModule) -> GraphModule:
        warn_unknown_modules(model, "set_module_name", self.module_name_config, quantizer=self.name)
        warn_unknown_modules(model, "set_module_type", self.module_type_config, quantizer=self.name)
        for node in model.graph.nodes:
            if not calls(node, _EMBEDDING) or qw.is_annotated(node):
                continue
            covering = self._config_for(node)
            config = covering.config
            if config is None:
                if covering.kind != "global":
                    mark_annotated(node)
                    set_skip_reason(node, f"{covering.description} is configured None")
                continue
            if self.filter_fn is not None and not self.filter_fn(node):
                set_skip_reason(node, "embedding: rejected by the filter function")
                continue
            reason = self._annotate(node, config)
            if reason is not None:
                set_skip_reason(node, f"embedding: {reason}")
        return model

    def _annotate(self, node: Node, config: EmbeddingConfig) -> str | None:
        table = node.args[0]
        if not isinstance(table, Node) or table.op != "get_attr":
            return "the table is not a constant of the model (weight-only quantization needs one)"
        shape = _table_shape(table)
        if shape is None or len(shape) != 2:
            return f"the table is not 2-D (shape {shape})"
        groups = config.groups
        if groups is not None and shape[1] % groups:
            return f"rows of {shape[1]} elements do not split into groups of {groups}"
        spec: qw.QuantizationSpecBase = config.weight_spec()
        others = [u for u in table.users if u is not node and u.target != _EMBEDDING]
        if others and self.tied == "skip":
            names = ", ".join(repr(u.name) for u in others)
            return f"tied table (its weight is also read by {names}) and tied='skip'"
        if others and self.tied == "share":
            for user in others:
                annotation = user.meta.get(ANNOTATION_KEY)
                theirs = None if annotation is None else annotation.input_qspec_map.get(table)
                if _per_row_spec(theirs):
                    spec = qw.SharedQuantizationSpec((table, user))
                    break
        qw.annotate_input_qspec_map(node, table, spec)
        mark_annotated(node)
        return None

"""``ExecuTorchQuantizer``: ExecuTorch recipes as a composition of two plugins.

- ``"llm"``: XNNPACK dynamic quantization of linears (int8 activations quantized at run
  time with a (scale, zero point) per token -- what XNNPACK's dynamic linear computes, so the
  program matches the converted model; ``act_granularity="per_tensor"`` takes one per call,
  as ExecuTorch's own ``XNNPACKQuantizer`` -- int8 per-channel weights, or 4-bit per-channel
  weights with ``linear_bits=4``; with ``linear_group_size`` as well, ExecuTorch's 8da4w: int4
  weights with a scale per group of input channels, lowered to XNNPACK's blockwise 4-bit
  kernels; ``linear_overrides`` keeps layers 8-bit, 4-bit or float by module name or type) from
  ``quantweave-xnnpack``, then embedding tables weight-only (8-bit per row, or 4-bit
  group-wise with ``embedding_bits=4``; ``embedding_scale_dtype=torch.float16`` for scales
  stored in 2 bytes) from ``quantweave-embedding``. XNNPACK comes first
  so that a table tied to the head shares the head's per-row quantization (one quantized
  copy; ``tied="own"`` quantizes the table with its own config, ``"skip"`` leaves it float);
- ``"vision"``: XNNPACK static quantization with per-channel weights.

The recipe is an ordinary :class:`quantweave.ComposableQuantizer` of the plugins' public
quantizer classes: ``capability_table()`` says which plugin serves each pattern and what
is shadowed, ``quantization_capabilities()`` is what the composition serves (with each
member plugin as provenance), and the annotation report names the member that quantized
each node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

import quantweave as qw
from quantweave.plugin_api import Capability, Quantizer
from quantweave_embedding import EmbeddingQuantizer
from quantweave_xnnpack import XNNPACKQuantizer, get_symmetric_quantization_config

from ._capabilities import PRESETS
from ._linears import linear_quantizer

__all__ = ["ExecuTorchQuantizer"]

_LLM_DEFAULTS: dict[str, Any] = {
    "embedding_bits": 8,
    "embedding_group_size": None,
    "embedding_symmetric": None,
    "linear_bits": 8,
    "tied": "share",
    "act_granularity": "per_token",
    "embedding_scale_dtype": torch.float32,
    "linear_group_size": None,
    "linear_overrides": None,
}


class ExecuTorchQuantizer(qw.ComposableQuantizer):
    """An ExecuTorch recipe (see the module docstring)::

        ExecuTorchQuantizer("llm")  # 8-bit tables + dynamic int8 linears
        ExecuTorchQuantizer("llm", embedding_bits=4, embedding_group_size=32)  # 4-bit tables
        ExecuTorchQuantizer("llm", linear_bits=4)  # 4-bit per-channel linear weights
        ExecuTorchQuantizer("llm", linear_bits=4, linear_group_size=32)  # 8da4w (XNNPACK blockwise 4-bit)
        ExecuTorchQuantizer("llm", linear_bits=4, linear_group_size=32, linear_overrides={"lm_head": 8})
        ExecuTorchQuantizer("llm", act_granularity="per_tensor")  # ExecuTorch's own dynamic form
        ExecuTorchQuantizer("llm", embedding_bits=4, embedding_scale_dtype=torch.float16)  # 2-byte table scales
        ExecuTorchQuantizer("vision")  # static per-channel XNNPACK

    ``embedding_bits=None`` / ``linear_bits=None`` drop that part of the ``"llm"`` recipe.
    """

    def __init__(
        self,
        preset: str = "llm",
        *,
        embedding_bits: int | None = 8,
        embedding_group_size: int | None = None,
        embedding_symmetric: bool | None = None,
        linear_bits: int | None = 8,
        tied: str = "share",
        act_granularity: str = "per_token",
        embedding_scale_dtype: torch.dtype = torch.float32,
        linear_group_size: int | None = None,
        linear_overrides: Mapping[Any, int | None] | None = None,
    ) -> None:
        if preset not in PRESETS:
            raise ValueError(f"ExecuTorchQuantizer: preset must be one of {', '.join(PRESETS)}; got {preset!r}")
        options = {
            "embedding_bits": embedding_bits,
            "embedding_group_size": embedding_group_size,
            "embedding_symmetric": embedding_symmetric,
            "linear_bits": linear_bits,
            "tied": tied,
            "act_granularity": act_granularity,
            "embedding_scale_dtype": embedding_scale_dtype,
            "linear_group_size": linear_group_size,
            "linear_overrides": linear_overrides,
        }
        members: list[Quantizer] = []
        if preset == "vision":
            changed = sorted(k for k, v in options.items() if v != _LLM_DEFAULTS[k])
            if changed:
                raise ValueError(f"ExecuTorchQuantizer: {', '.join(changed)} apply to the 'llm' preset only")
            members.append(_xnnpack(get_symmetric_quantization_config(is_per_channel=True)))
        else:
            if linear_bits is not None:
                members.append(linear_quantizer(linear_bits, linear_group_size, act_granularity, linear_overrides))
            elif linear_group_size is not None or linear_overrides:
                raise ValueError("ExecuTorchQuantizer: linear_group_size / linear_overrides need linear_bits (4 or 8)")
            if embedding_bits is not None:
                embedding = EmbeddingQuantizer(
                    embedding_bits,
                    embedding_group_size,
                    symmetric=embedding_symmetric,
                    tied=tied,
                    scale_dtype=embedding_scale_dtype,
                )
                embedding.plugin = "embedding"
                members.append(embedding)
            if not members:
                raise ValueError("ExecuTorchQuantizer: embedding_bits and linear_bits are both None: nothing to do")
        super().__init__(members)
        self.name = "executorch"
        self.plugin = "executorch"  # the plugin providing the recipe (its members name their own plugins)
        self.preset = preset
        self.options = options if preset == "llm" else {}

    def quantization_capabilities(self) -> list[Capability]:
        """The members' declarations, each with its member's plugin as provenance (the members
        of a recipe declare disjoint (pattern, mode) keys; ``capability_table()`` says who
        serves what op by op)."""
        caps: list[Capability] = []
        for member in self.quantizers:
            for cap in member.quantization_capabilities():
                caps.append(cap if cap.plugin else replace(cap, plugin=member.plugin))
        return caps

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items() if v != _LLM_DEFAULTS[k])
        return f"ExecuTorchQuantizer({self.preset!r}{', ' + options if options else ''}; {' + '.join(self.labels)})"


def _xnnpack(config: qw.QuantizationConfig) -> XNNPACKQuantizer:
    quantizer = XNNPACKQuantizer().set_global(config)
    quantizer.plugin = "xnnpack"
    return quantizer

"""What the ExecuTorch recipes declare: the declarations of the member plugins they compose
(cheap to import: only the members' declaration modules are loaded)."""

from __future__ import annotations

from dataclasses import replace

import quantweave_embedding
import quantweave_xnnpack
from quantweave.plugin_api import Capability

__all__ = ["PRESETS", "declared_capabilities", "member_declarations"]

#: preset -> what it composes
PRESETS = {
    "llm": "dynamic per-channel linear (quantweave-xnnpack) + embedding tables weight-only (quantweave-embedding)",
    "vision": "static per-channel XNNPACK (quantweave-xnnpack)",
}


def member_declarations(
    preset: str = "llm",
    embedding_bits: int | None = 8,
    embedding_group_size: int | None = None,
    embedding_symmetric: bool | None = None,
    linear_bits: int | None = 8,
    act_granularity: str = "per_token",
    linear_group_size: int | None = None,
) -> list[tuple[str, tuple[Capability, ...]]]:
    """(plugin, its declarations) per member of the recipe, in member order."""
    if preset == "vision":
        return [("xnnpack", quantweave_xnnpack.declared_capabilities(is_per_channel=True))]
    members = []
    if linear_bits is not None:
        four: dict[str, int] = {"weight_qmin": -8, "weight_qmax": 7} if linear_bits == 4 else {}
        if linear_group_size is not None:  # 8da4w: blockwise weights, activations per token
            four["weight_group_size"] = linear_group_size
            act_granularity = "per_token"
        members.append(
            (
                "xnnpack",
                quantweave_xnnpack.declared_capabilities(
                    is_per_channel=True, is_dynamic=True, act_granularity=act_granularity, **four
                ),
            )
        )
    if embedding_bits is not None:
        caps = quantweave_embedding.declared_capabilities(embedding_bits, embedding_group_size, embedding_symmetric)
        members.append(("embedding", caps))
    return members


def declared_capabilities(
    preset: str = "llm",
    embedding_bits: int | None = 8,
    embedding_group_size: int | None = None,
    embedding_symmetric: bool | None = None,
    linear_bits: int | None = 8,
    act_granularity: str = "per_token",
    linear_group_size: int | None = None,
) -> tuple[Capability, ...]:
    """What an ``ExecuTorchQuantizer`` with these options quantizes: its members'
    declarations, each with the member plugin as provenance (``plugin``) and in ``notes``.
    The members of a recipe declare disjoint (pattern, mode) keys, so none shadows another."""
    out: list[Capability] = []
    for plugin, caps in member_declarations(
        preset,
        embedding_bits,
        embedding_group_size,
        embedding_symmetric,
        linear_bits,
        act_granularity,
        linear_group_size,
    ):
        for cap in caps:
            note = f"served by quantweave-{plugin}" + (f"; {cap.notes}" if cap.notes else "")
            out.append(replace(cap, plugin=plugin, notes=note))
    keys = [c.key for c in out]
    if len(set(keys)) != len(keys):  # pragma: no cover - a recipe whose members overlap would need the table
        raise AssertionError(f"recipe {preset!r}: members declare overlapping (pattern, mode) keys")
    return tuple(out)

"""A composition's capability table as text and as JSON: which plugin serves each
(pattern, mode), as which of its patterns, and whose declaration is shadowed."""

from __future__ import annotations

import json
from typing import Any

import quantweave as qw

__all__ = ["capability_table_json", "capability_table_records", "capability_table_text"]

_COLUMNS = ("pattern", "mode", "served by", "declared by", "shadowed", "weight", "activation", "output")


def _plugins(composed: qw.ComposableQuantizer) -> dict[str, str]:
    """member label -> the plugin that provided it (its ``plugin``, or the plugin its
    declarations name)."""
    out = {}
    for label, member in zip(composed.labels, composed.quantizers, strict=True):
        plugin = getattr(member, "plugin", "") or ""
        if not plugin:
            caps = list(member.quantization_capabilities())
            plugin = next((c.plugin for c in caps if getattr(c, "plugin", "")), "")
        out[label] = plugin
    return out


def capability_table_records(composed: qw.ComposableQuantizer) -> list[dict[str, Any]]:
    """One record per row of ``composed.capability_table()``: ``pattern``, ``mode``,
    ``served_by`` (member label, ``""`` if none), ``plugin`` (the plugin whose declaration is
    served), ``served_by_plugin`` (the plugin that provided the serving member),
    ``served_as`` (per op: ``[member, pattern]`` or None), ``shadowed`` (member labels) and
    ``shadowed_plugins``, and the served capability's fields (``capability``)."""
    plugins = _plugins(composed)
    records = []
    for row in composed.capability_table():
        cap = row.capability
        records.append(
            {
                "pattern": row.pattern,
                "mode": row.mode.value,
                "served_by": row.served_by,
                "served_by_plugin": plugins.get(row.served_by, ""),
                "plugin": cap.plugin,
                "served_as": [None if step is None else list(step) for step in row.served_as],
                "served_as_declared": row.served_as_declared,
                "shadowed": list(row.shadowed),
                "shadowed_plugins": [plugins.get(label, "") for label in row.shadowed],
                "capability": cap.to_dict(),
            }
        )
    return records


def capability_table_json(composed: qw.ComposableQuantizer) -> str:
    """:func:`capability_table_records` as JSON."""
    return json.dumps(capability_table_records(composed), indent=2)


def capability_table_text(composed: qw.ComposableQuantizer) -> str:
    """The table as aligned text: one line per (pattern, mode)."""
    rows = [_COLUMNS]
    for record, row in zip(capability_table_records(composed), composed.capability_table(), strict=True):
        cap = row.capability
        served = record["served_by"] or "-"
        if record["served_by_plugin"] and record["served_by_plugin"] != record["served_by"]:
            served += f" ({record['served_by_plugin']})"
        shadowed = ", ".join(
            label + (f" ({plugin})" if plugin and plugin != label else "")
            for label, plugin in zip(record["shadowed"], record["shadowed_plugins"], strict=True)
        )
        rows.append(
            (
                row.pattern,
                row.mode.value,
                served,
                cap.plugin or "-",
                shadowed or "-",
                "-" if cap.weight is None else str(cap.weight),
                "-" if cap.activation is None else str(cap.activation),
                "?" if cap.output is None else str(cap.output),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)

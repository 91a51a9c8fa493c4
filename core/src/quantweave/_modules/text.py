"""Plain-text rendering shared by the CLI and the reports."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["format_db", "json_number", "render_table"]


def render_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns left-aligned to their widest cell, a dashed rule under the header,
    trailing spaces stripped."""
    widths = [len(str(cell)) for cell in header]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"render_table: expected rows of {len(header)} cells; got {len(row)} in {row!r}")
        widths = [max(w, len(str(cell))) for w, cell in zip(widths, row, strict=True)]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def json_number(value: Any) -> Any:
    """``value`` as JSON can hold it: a non-finite float as ``"inf"``, ``"-inf"`` or ``"nan"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else "-inf" if value < 0 else "nan"
    return value


def format_db(value: float) -> str:
    """A decibel figure with two decimals (``"inf"`` when infinite)."""
    return "inf" if value == math.inf else f"{value:.2f}"

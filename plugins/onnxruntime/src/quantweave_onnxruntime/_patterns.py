"""Patterns this plugin adds to quantweave's vocabulary (hook ``quantweave_patterns``), with the
probe models the conformance kit annotates: ops ONNX Runtime's CPU provider runs on int8 data
that the core vocabulary does not name."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from quantweave.plugin_api import PatternSpec

from ._capabilities import CONTRIBUTED_OPS

__all__ = ["PATTERNS", "patterns"]


class _ConvThen(torch.nn.Module):
    """A conv (quantized by the recipe) followed by the op under test."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.conv(x)
        if self.kind == "split":
            a, b = torch.split(y, 4, dim=1)
            return a, b
        mode = "bilinear" if self.kind == "resize_bilinear" else "nearest"
        return (F.interpolate(y, scale_factor=2.0, mode=mode),)


def _probe(kind: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return _ConvThen(kind), (torch.randn(1, 3, 12, 12),)


PATTERNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "split": ("split into equal chunks (probe: conv -> split in two)", CONTRIBUTED_OPS["split"]),
    "resize": ("nearest upsampling (probe: conv -> interpolate x2)", CONTRIBUTED_OPS["resize"]),
    "resize_bilinear": (
        "bilinear upsampling (probe: conv -> interpolate x2, bilinear)",
        CONTRIBUTED_OPS["resize_bilinear"],
    ),
}


def patterns() -> list[PatternSpec]:
    """The contributed patterns, each with its probe (fed by a conv: ORT runs them on int8 data
    only after a quantized producer)."""
    return [
        PatternSpec(name, description, ops, probe=functools.partial(_probe, name), producer="conv2d")
        for name, (description, ops) in PATTERNS.items()
    ]

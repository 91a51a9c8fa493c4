"""Helpers shared by the test modules (fixtures stay in conftest.py)."""

import torch


def export(model: torch.nn.Module, *args: torch.Tensor) -> torch.fx.GraphModule:
    """Default (non-strict) torch.export, as users call it."""
    return torch.export.export(model.eval(), args).module()

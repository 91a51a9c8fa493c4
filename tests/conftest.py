import warnings

import pytest
import torch

warnings.filterwarnings("ignore", message=".*LeafSpec.*")


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


def export(model: torch.nn.Module, *args: torch.Tensor) -> torch.fx.GraphModule:
    """Default (non-strict) torch.export, as users call it."""
    return torch.export.export(model.eval(), args).module()

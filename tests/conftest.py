import warnings

import pytest
import torch

warnings.filterwarnings("ignore", message=".*LeafSpec.*")


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)

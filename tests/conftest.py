import warnings

import pytest
import torch

warnings.filterwarnings("ignore", message=".*LeafSpec.*")


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session", autouse=True)
def _torchao_patterns_exported_once():
    """torchao's conv-bn pattern graphs exported once per session where torchao is installed
    (tests/peer/torchao_patterns.py: each torchao ``convert_pt2e`` would export 32 of them, and
    ExecuTorch's XNNPACKQuantizer several on every annotate); a no-op without torchao."""
    from tests.peer.torchao_patterns import patterns_exported_once

    yield from patterns_exported_once()

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


@pytest.fixture(scope="session", autouse=True)
def _cia_ops_collected_once():
    """torch's walk for the preservable CompositeImplicitAutograd ops, 5 per ExecuTorch lowering (run
    by every ``run_decompositions``), done once per operator registry state (tests/executorch_speedups.py)."""
    from tests.executorch_speedups import cia_ops_collected_once

    yield from cia_ops_collected_once()


@pytest.fixture(scope="session", autouse=True)
def _node_sources_shared():
    """torch's provenance records (``NodeSource``) shared, not deep-copied, by every node a pass
    re-creates: ~11 % of an ExecuTorch lowering (tests/executorch_speedups.py)."""
    from tests.executorch_speedups import node_sources_shared

    yield from node_sources_shared()


@pytest.fixture(scope="session", autouse=True)
def _lowering_speedups():
    """GraphModule code generation deferred inside ExecuTorch's lowerings (tests/executorch_speedups.py)."""
    from tests.executorch_speedups import lowering_speedups

    with lowering_speedups() as stats:
        yield stats

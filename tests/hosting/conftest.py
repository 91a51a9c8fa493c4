import pytest


@pytest.fixture(scope="session", autouse=True)
def torchao_patterns_exported_once():
    """torchao's conv-bn pattern graphs exported once per session (tests/peer/torchao_patterns.py):
    every torchao ``convert_pt2e`` of the parity tests would otherwise export 32 of them."""
    from tests.peer.torchao_patterns import patterns_exported_once

    yield from patterns_exported_once()

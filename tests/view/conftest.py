import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "view: Model Explorer overlays and matplotlib plots (needs quantweave[view,plots]; tox 'view' env)"
    )

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _zoo_counts():
    """QUANTWEAVE_ZOO_COUNTS=PATH: count the zoo's expensive steps into PATH (tests/zoo/counts.py)."""
    path = os.environ.get("QUANTWEAVE_ZOO_COUNTS")
    if not path:
        yield None
        return
    from .counts import counting

    yield from counting(path)

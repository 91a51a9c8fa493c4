import types

import pytest

torchao_pt2e = pytest.importorskip(
    "torchao.quantization.pt2e.quantize_pt2e", reason="peer tests need torchao (tox -e peer)"
)


@pytest.fixture(scope="session")
def torchao_api() -> types.SimpleNamespace:
    from quantweave.testing.reference import torchao_api as names

    return names()


@pytest.fixture(scope="session")
def torchao_flow():
    return torchao_pt2e.prepare_pt2e, torchao_pt2e.convert_pt2e

import importlib.util

import pytest

from quantweave.testing import digits  # imports scikit-learn only when the data is loaded

from .cases import MODEL_NAMES, SEED

# without scikit-learn (every tox env but 'accuracy') there is nothing to run here
collect_ignore_glob = [] if importlib.util.find_spec("sklearn") is not None else ["test_*.py"]


@pytest.fixture(scope="session")
def data() -> digits.DigitsData:
    return digits.load_digits_data()


@pytest.fixture(scope="session")
def trained(data):
    """name -> (float model trained with SEED, its test accuracy in percent)."""
    out = {}
    for name in MODEL_NAMES:
        model = digits.trained_model(name, seed=SEED, data=data)
        out[name] = (model, digits.accuracy(model, data.test_x, data.test_y))
    return out

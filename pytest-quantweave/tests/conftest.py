import importlib.metadata

import pytest

pytest_plugins = ["pytester"]


def _installed() -> bool:
    """pytest-quantweave's pytest11 entry point is installed (it is then loaded by pytest itself)."""
    return any(ep.value == "pytest_quantweave.plugin" for ep in importlib.metadata.entry_points(group="pytest11"))


@pytest.fixture
def run(pytester):
    """Run pytest in pytester's directory with the kit's plugin loaded (through its entry point when installed)."""
    load = [] if _installed() else ["-p", "pytest_quantweave.plugin"]

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest(*load, "-p", "no:cacheprovider", *args)

    return run


@pytest.fixture(scope="session", autouse=True)
def _torch_imported_before_pytester():
    """Inner pytest runs are in-process (a subprocess pays torch's import each time); pytester
    drops the modules an inner run imported, and torch must not import its lazily loaded
    parts twice: import them here, once, by running the kit on one capability per mode."""
    from quantweave.testing.conformance import check_capability
    from quantweave_contrib_template import plugin

    (info,) = plugin.quantweave_quantizers()
    for cap in info.capabilities:
        if cap.pattern == "linear":
            check_capability(info, cap)

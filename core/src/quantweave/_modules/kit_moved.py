"""The test-only modules that moved from ``quantweave.testing`` to pytest-quantweave.

``quantweave.testing.models``, ``.digits`` and ``.reference`` (reference models, the digits
data loader, the reference quantizer) ship in the distribution ``pytest-quantweave`` (the
conformance kit's pytest plugin), not in the core wheel. Their old import paths stay: each
is a stub that replaces itself with ``pytest_quantweave.<name>`` when the kit is installed,
and otherwise fails with an ImportError saying what to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["KIT_DISTRIBUTION", "moved_to_kit"]

KIT_DISTRIBUTION = "pytest-quantweave"


def moved_to_kit(name: str) -> ModuleType:
    """``pytest_quantweave.<name>``, or a ModuleNotFoundError naming ``pip install pytest-quantweave``."""
    target = f"pytest_quantweave.{name}"
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name not in ("pytest_quantweave", target):
            raise  # the kit is installed, something it imports is not: that error says what
        raise ModuleNotFoundError(
            f"quantweave.testing.{name} moved out of the quantweave wheel into {KIT_DISTRIBUTION} "
            f"(quantweave's test kit, module {target}); install it: pip install {KIT_DISTRIBUTION} "
            f"(from a checkout of quantweave: pip install ./{KIT_DISTRIBUTION})",
            name=f"quantweave.testing.{name}",
        ) from None

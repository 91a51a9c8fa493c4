"""Test helpers for quantweave users and plugin authors: the conformance kit
(:mod:`quantweave.testing.conformance`: declared capabilities against what a quantizer does),
:mod:`quantweave.testing.inspect` (a converted model's quantize / dequantize decisions read
back: ``qdq_summary``, ``sqnr``, ``count_ops``) and the plugin manager.

``quantweave.testing.PluginManager`` is the plugin manager (imported on first use): build a
fresh one in a test (``PluginManager(entry_points=[])``, then register your plugin module)
so the test sees only the plugins it registers.

The reference models, the reference quantizer and the digits data are not here: they ship in
pytest-quantweave (``pytest_quantweave.models``, ``.reference``, ``.digits``). Their old paths
``quantweave.testing.models``, ``.reference`` and ``.digits`` still import while
pytest-quantweave is installed (each *is* that module) and otherwise raise an ImportError
saying ``pip install pytest-quantweave``.
"""

from typing import Any

__all__ = ["PluginManager"]


def __getattr__(name: str) -> Any:
    if name == "PluginManager":
        from ..registry import PluginManager

        return PluginManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

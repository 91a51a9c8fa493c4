"""Test helpers for quantweave users and plugin authors: reference models and quantizer.

``quantweave.testing.PluginManager`` is the plugin manager (imported on first use): build a
fresh one in a test (``PluginManager(entry_points=[])``, then register your plugin module)
so the test sees only the plugins it registers.
"""

from typing import Any

__all__ = ["PluginManager"]


def __getattr__(name: str) -> Any:
    if name == "PluginManager":
        from ..registry import PluginManager

        return PluginManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The plugin API: pluggy hooks a quantweave plugin implements.

A plugin is a module (or object) registered under the entry-point group ``quantweave``::

    # pyproject.toml of the plugin distribution
    [project.entry-points.quantweave]
    x86 = "quantweave_x86.plugin"

The module declares the plugin-API version it was written for and implements hooks::

    import quantweave
    from quantweave.hookspecs import hookimpl

    QUANTWEAVE_PLUGIN_API = 1

    @hookimpl
    def quantweave_quantizers():
        return [quantweave.QuantizerInfo(name="x86", factory=X86Quantizer, capabilities=...)]

Compatibility rules: hooks are only ever *added* (never removed or renamed), and hook
arguments are only ever added. A plugin declaring an API major version other than
:data:`PLUGIN_API_VERSION` is not loaded (recorded as failed, with the reason).

Hooks, with the plugin-API version that introduced them:

* ``quantweave_quantizers()`` (API 1): the quantizers the plugin provides, as a list of
  :class:`quantweave.registry.QuantizerInfo` (name, factory, declared capabilities).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from .plugin_api import PLUGIN_API_VERSION, PROJECT, hookimpl

if TYPE_CHECKING:
    from .plugin_api import QuantizerInfo

__all__ = ["PLUGIN_API_VERSION", "PROJECT", "hookimpl", "hookspec", "QuantweaveHookSpecs"]


hookspec = pluggy.HookspecMarker(PROJECT)


class QuantweaveHookSpecs:
    """Hook specifications (pluggy). Plugins implement these as plain functions."""

    @hookspec
    def quantweave_quantizers(self) -> list[QuantizerInfo]:  # type: ignore[empty-body]
        """Return the quantizers this plugin provides (added in plugin API 1).

        Each item is a :class:`quantweave.registry.QuantizerInfo`. Names must be unique
        within the plugin; across plugins a clash is resolved by qualifying the name as
        ``"<plugin>:<quantizer>"``.
        """

"""The hook specifications (pluggy) of the plugin API; the loader registers these.

Plugins do not import this module: everything a plugin needs is in
:mod:`quantweave.plugin_api` (``hookimpl``, ``QuantizerInfo``, ``PatternSpec``, ...).
``hookimpl`` and the constants stay importable from here for plugins written against
plugin API 1.

Compatibility rules: hooks are only ever *added* (never removed or renamed), and hook
arguments are only ever added. A core implementing plugin API N loads plugins that target
1..N; a plugin targeting a newer API is recorded ``incompatible``, with the reason.

Hooks, with the plugin-API version that introduced them (:data:`HOOK_API_VERSIONS`):

* ``quantweave_quantizers()`` (API 1): the quantizers the plugin provides, as a list of
  :class:`quantweave.plugin_api.QuantizerInfo` (name, factory, declared capabilities).
* ``quantweave_patterns()`` (API 2): patterns the plugin adds to the vocabulary, as a list
  of :class:`quantweave.plugin_api.PatternSpec`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from .plugin_api import PLUGIN_API_VERSION, PROJECT, hookimpl

if TYPE_CHECKING:
    from .plugin_api import PatternSpec, QuantizerInfo

__all__ = ["HOOK_API_VERSIONS", "PLUGIN_API_VERSION", "PROJECT", "hookimpl", "hookspec", "QuantweaveHookSpecs"]


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

    @hookspec
    def quantweave_patterns(self) -> list[PatternSpec]:  # type: ignore[empty-body]
        """Return the patterns this plugin adds to the vocabulary (added in plugin API 2).

        Each item is a :class:`quantweave.plugin_api.PatternSpec`: name, description, the
        aten ops that anchor it (first = anchor) and a probe factory for the conformance
        kit. A name that is a core pattern, or that another plugin already contributes, is
        reported (naming both) and ignored; capabilities may then declare the pattern.
        """


#: Every hook, with the plugin-API version that introduced it.
HOOK_API_VERSIONS: dict[str, int] = {"quantweave_quantizers": 1, "quantweave_patterns": 2}

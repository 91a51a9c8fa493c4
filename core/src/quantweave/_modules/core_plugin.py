"""The core's own registration: the core patterns, contributed through the same
``quantweave_patterns`` hook a plugin implements. Every ``PluginManager`` registers
:data:`CORE` with pluggy before any plugin (it is no entry point and is not listed among
the plugins)."""

from __future__ import annotations

from ..plugin_api import hookimpl
from ..vocabulary import PatternSpec, core_vocabulary

__all__ = ["CORE", "CORE_NAME", "CorePatterns"]

#: the name the core registers under (not a plugin name: entry-point names cannot hold ':')
CORE_NAME = "quantweave:core"


class CorePatterns:
    """The core vocabulary as a pluggy plugin."""

    @hookimpl
    def quantweave_patterns(self) -> list[PatternSpec]:
        return list(core_vocabulary().values())


CORE = CorePatterns()

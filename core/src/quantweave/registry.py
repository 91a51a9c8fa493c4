"""Plugin discovery and the quantizer registry.

Plugins are found through the entry-point group ``quantweave`` and loaded *lazily*: nothing
is imported until plugins, quantizers or capabilities are first asked for. Each entry point
is loaded on its own: a plugin that fails to import, raises, declares an incompatible
plugin-API version or returns malformed declarations is recorded as ``failed`` with the
reason and a :class:`~quantweave.errors.PluginWarning`; it never crashes the host.

Environment variables (read when plugins are first loaded):

``QUANTWEAVE_DISABLE_PLUGINS=a,b``  do not load these plugins (status ``disabled``);
``QUANTWEAVE_LOAD_PLUGINS=a,b``     load only these (set and empty: load none);
``QUANTWEAVE_STRICT_PLUGINS=1``     re-raise the first plugin failure instead of warning.

Tests should use a fresh, isolated :class:`PluginManager` (``PluginManager(entry_points=[])``
plus :meth:`PluginManager.register`) rather than whatever happens to be installed.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy

from .capabilities import Capability, Mode, sort_capabilities
from .errors import PluginError, PluginWarning, UnknownQuantizerError
from .hookspecs import QuantweaveHookSpecs
from .plugin_api import PLUGIN_API_VERSION, PROJECT, QuantizerInfo
from .quantizer import Quantizer

__all__ = [
    "PluginManager",
    "PluginRecord",
    "QuantizerInfo",
    "default_manager",
    "get_quantizer",
    "plugins",
    "quantization_capabilities",
]

ENV_DISABLE = "QUANTWEAVE_DISABLE_PLUGINS"
ENV_LOAD = "QUANTWEAVE_LOAD_PLUGINS"
ENV_STRICT = "QUANTWEAVE_STRICT_PLUGINS"


@dataclass(frozen=True)
class PluginRecord:
    """What is known of one plugin: where it came from and whether it loaded."""

    name: str
    distribution: str | None
    version: str | None
    status: str  # "loaded", "failed" or "disabled"
    quantizers: tuple[str, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "quantizers": list(self.quantizers),
            "error": self.error,
        }


_ENTRY_POINT_CACHE: list[importlib.metadata.EntryPoint] | None = None


def _installed_entry_points() -> list[importlib.metadata.EntryPoint]:
    """Entry points of group ``quantweave``, scanned once per process."""
    global _ENTRY_POINT_CACHE
    if _ENTRY_POINT_CACHE is None:
        _ENTRY_POINT_CACHE = list(importlib.metadata.entry_points(group=PROJECT))
    return _ENTRY_POINT_CACHE


def _names(value: str | None) -> set[str]:
    return {part.strip() for part in (value or "").split(",") if part.strip()}


class PluginManager:
    """Loads plugins and answers registry queries.

    ``entry_points``: the entry points to consider (default: those installed, group
    ``quantweave``). ``environ``: where the ``QUANTWEAVE_*`` variables are read (default
    ``os.environ``). ``strict``: overrides ``QUANTWEAVE_STRICT_PLUGINS``.
    """

    def __init__(
        self,
        *,
        entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
        environ: Mapping[str, str] | None = None,
        strict: bool | None = None,
    ) -> None:
        self._entry_points = None if entry_points is None else list(entry_points)
        self._environ = os.environ if environ is None else environ
        self._strict = strict
        self._pm = pluggy.PluginManager(PROJECT)
        self._pm.add_hookspecs(QuantweaveHookSpecs)
        self._records: dict[str, PluginRecord] = {}
        self._infos: dict[str, dict[str, QuantizerInfo]] = {}  # plugin -> quantizer name -> info
        self._loaded = False

    # -- loading --------------------------------------------------------------------------

    @property
    def strict(self) -> bool:
        if self._strict is not None:
            return self._strict
        return self._environ.get(ENV_STRICT, "").strip().lower() in ("1", "true", "yes", "on")

    def load(self) -> None:
        """Load every entry point once (called by every query)."""
        if self._loaded:
            return
        self._loaded = True
        entry_points = _installed_entry_points() if self._entry_points is None else self._entry_points
        disabled = _names(self._environ.get(ENV_DISABLE))
        allowed = _names(self._environ.get(ENV_LOAD)) if ENV_LOAD in self._environ else None
        seen: dict[str, str] = {}
        for ep in entry_points:
            if ep.name in seen:
                if seen[ep.name] != ep.value:
                    self._fail(
                        ep.name,
                        _dist(ep),
                        f"duplicate plugin name {ep.name!r}: {ep.value!r} ignored, {seen[ep.name]!r} already loaded",
                        record=False,
                    )
                continue  # the same entry point listed twice (e.g. a path on sys.path twice)
            seen[ep.name] = ep.value
            dist, version = _dist(ep)
            if ep.name in disabled or (allowed is not None and ep.name not in allowed):
                why = f"disabled by {ENV_DISABLE}" if ep.name in disabled else f"not listed in {ENV_LOAD}"
                self._records[ep.name] = PluginRecord(ep.name, dist, version, "disabled", error=why)
                continue
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as exc:  # a plugin must never take the host down
                self._fail(ep.name, (dist, version), f"import failed: {type(exc).__name__}: {exc}", exc)
                continue
            self.register(ep.name, plugin, distribution=dist, version=version)

    def register(
        self, name: str, plugin: object, *, distribution: str | None = None, version: str | None = None
    ) -> PluginRecord:
        """Register a plugin object (module or instance) under ``name``; returns its record.

        Used by the entry-point loader, and directly by tests and in-process plugins.
        """
        where = (distribution, version)
        if name in self._records and self._records[name].status == "loaded":
            return self._fail(name, where, f"a plugin named {name!r} is already registered", record=False)
        api = getattr(plugin, "QUANTWEAVE_PLUGIN_API", None)
        if api is None:
            return self._fail(name, where, "does not declare QUANTWEAVE_PLUGIN_API (the plugin-API version it targets)")
        if not isinstance(api, int) or isinstance(api, bool) or not 1 <= api <= PLUGIN_API_VERSION:
            return self._fail(
                name,
                where,
                f"declares plugin API {api!r}, but this quantweave implements plugin API {PLUGIN_API_VERSION}",
            )
        try:
            self._pm.register(plugin, name=name)
            self._pm.check_pending()
        except Exception as exc:
            self._unregister(plugin)
            return self._fail(name, where, f"invalid hooks: {exc}", exc)
        try:
            infos = self._call_quantizers_hook(plugin)
        except Exception as exc:
            self._unregister(plugin)
            return self._fail(name, where, f"quantweave_quantizers() failed: {type(exc).__name__}: {exc}", exc)
        self._infos[name] = infos
        record = PluginRecord(name, distribution, version, "loaded", tuple(infos))
        self._records[name] = record
        return record

    def _unregister(self, plugin: object) -> None:
        if self._pm.is_registered(plugin):
            self._pm.unregister(plugin)

    def _call_quantizers_hook(self, plugin: object) -> dict[str, QuantizerInfo]:
        infos: dict[str, QuantizerInfo] = {}
        for impl in self._pm.hook.quantweave_quantizers.get_hookimpls():
            if impl.plugin is not plugin:
                continue
            result = impl.function()
            if not isinstance(result, (list, tuple)):
                raise TypeError(f"expected a list of QuantizerInfo; got {type(result).__name__}")
            for info in result:
                if not isinstance(info, QuantizerInfo):
                    raise TypeError(f"expected QuantizerInfo items; got {type(info).__name__}")
                if info.name in infos:
                    raise ValueError(f"quantizer name {info.name!r} is declared twice")
                infos[info.name] = info
        return infos

    def _fail(
        self,
        name: str,
        where: tuple[str | None, str | None],
        reason: str,
        exc: BaseException | None = None,
        record: bool = True,
    ) -> PluginRecord:
        dist, version = where
        failed = PluginRecord(name, dist, version, "failed", error=reason)
        if record:
            self._records[name] = failed
        origin = f" ({dist} {version})" if dist else ""
        message = f"quantweave plugin {name!r}{origin} was not loaded: {reason}"
        if self.strict:
            raise PluginError(message) from exc
        warnings.warn(message, PluginWarning, stacklevel=3)
        return failed

    # -- queries --------------------------------------------------------------------------

    def plugins(self) -> list[PluginRecord]:
        """Every plugin seen: loaded, failed and disabled, sorted by name."""
        self.load()
        return [self._records[name] for name in sorted(self._records)]

    def quantizer_infos(self) -> dict[str, QuantizerInfo]:
        """Every available quantizer under its qualified name ``"<plugin>:<quantizer>"``."""
        self.load()
        return {
            f"{plugin}:{name}": info for plugin, infos in sorted(self._infos.items()) for name, info in infos.items()
        }

    def resolve(self, name: str) -> tuple[str, QuantizerInfo]:
        """``(plugin, info)`` for a bare or qualified quantizer name."""
        infos = self.quantizer_infos()
        if name in infos:
            return name.split(":", 1)[0], infos[name]
        matches = [qualified for qualified in infos if qualified.split(":", 1)[1] == name]
        if len(matches) == 1:
            return matches[0].split(":", 1)[0], infos[matches[0]]
        if matches:
            raise UnknownQuantizerError(
                f"quantizer name {name!r} is ambiguous: provided by {', '.join(matches)}; use a qualified name"
            )
        available = ", ".join(sorted(infos)) or "none (no plugin is loaded; see `quantweave plugins`)"
        raise UnknownQuantizerError(f"no quantizer named {name!r}; available: {available}")

    def get_quantizer(self, name: str, **options: Any) -> Quantizer:
        """Build the quantizer ``name`` (bare or ``plugin:name``) with ``options``."""
        plugin, info = self.resolve(name)
        try:
            quantizer = info.factory(**options)
        except TypeError as exc:
            raise TypeError(f"quantizer {plugin}:{info.name} rejected options {sorted(options)}: {exc}") from exc
        except Exception as exc:
            raise PluginError(
                f"quantizer {plugin}:{info.name} (plugin {plugin!r}) failed to build: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(quantizer, Quantizer):
            raise PluginError(
                f"quantizer {plugin}:{info.name}: factory returned {type(quantizer).__name__}, "
                "expected a quantweave.Quantizer"
            )
        return quantizer

    def quantization_capabilities(
        self, *, plugin: str | None = None, mode: Mode | str | None = None
    ) -> list[Capability]:
        """Declared capabilities of every loaded quantizer, with provenance filled in."""
        wanted_mode = None if mode is None else Mode(mode)
        caps = []
        for qualified, info in self.quantizer_infos().items():
            owner = qualified.split(":", 1)[0]
            if plugin is not None and owner != plugin:
                continue
            for cap in info.capabilities:
                if wanted_mode is None or cap.mode is wanted_mode:
                    caps.append(cap.with_provenance(owner, info.name))
        return sort_capabilities(caps)


def _dist(ep: importlib.metadata.EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    return dist.metadata["Name"], dist.version


_DEFAULT: PluginManager | None = None


def default_manager() -> PluginManager:
    """The process-wide manager over installed plugins (created on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = PluginManager()
    return _DEFAULT


def plugins() -> list[PluginRecord]:
    """Installed plugins: name, distribution, version, status, quantizers, error."""
    return default_manager().plugins()


def get_quantizer(name: str, **options: Any) -> Quantizer:
    """Build an installed quantizer by name (``"x86"`` or ``"x86:x86"``)."""
    return default_manager().get_quantizer(name, **options)


def quantization_capabilities(*, plugin: str | None = None, mode: Mode | str | None = None) -> list[Capability]:
    """Declared capabilities of everything installed."""
    return default_manager().quantization_capabilities(plugin=plugin, mode=mode)

"""Plugin discovery and the quantizer registry.

Plugins are found through the entry-point group ``quantweave`` and loaded *lazily*: nothing
is imported until plugins, quantizers or capabilities are first asked for. Each entry point
is loaded on its own: a plugin that fails to import, raises, declares an incompatible
plugin-API version or returns malformed declarations is recorded as ``failed`` with the
reason and a :class:`~quantweave.errors.PluginWarning`; it never crashes the host.

Environment variables (read when plugins are first loaded):

``QUANTWEAVE_DISABLE_PLUGINS=a,b``  do not load these plugins (status ``disabled``);
``QUANTWEAVE_LOAD_PLUGINS=a,b``     load only these (set and empty: load none);
``QUANTWEAVE_STRICT_PLUGINS=1``     re-raise the first plugin failure instead of warning
                                    (``1``/``true``/``yes``/``on``; ``0``/``false``/``no``/``off``
                                    or empty: warn; any other value raises ``ValueError``).

Plugin names in the two lists are separated by commas; a name that is no installed plugin
is warned about (with the installed names).

Tests should use a fresh, isolated :class:`PluginManager` (``PluginManager(entry_points=[])``
plus :meth:`PluginManager.register`) rather than whatever happens to be installed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pluggy

from ._modules.core_plugin import CORE, CORE_NAME
from ._modules.derive import derived_for_info
from ._modules.foreign import is_pt2e_quantizer
from .capabilities import Capability, Mode, PatternSpec, sort_capabilities
from .errors import PluginError, PluginWarning, UnknownQuantizerError
from .hookspecs import QuantweaveHookSpecs
from .plugin_api import PLUGIN_API_RELEASES, PLUGIN_API_VERSION, PROJECT, QuantizerInfo
from .quantizer import Quantizer
from .vocabulary import Vocabulary

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
#: the values QUANTWEAVE_STRICT_PLUGINS accepts (case and surrounding spaces ignored)
STRICT_VALUES = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False}
STRICT_VALUES |= {"off": False, "": False}


def _flag(environ: Mapping[str, str], variable: str, accepted: Mapping[str, bool]) -> bool:
    """A boolean environment variable; ValueError naming it and the value not understood."""
    value = environ.get(variable, "")
    flag = accepted.get(value.strip().lower())
    if flag is None:
        true = ", ".join(k for k, v in accepted.items() if v)
        false = ", ".join(k for k, v in accepted.items() if not v and k)
        raise ValueError(
            f"{variable}={value!r} is not understood; accepted values: {true} (on) or {false}, empty (off)"
        )
    return flag


@dataclass(frozen=True)
class PluginRecord:
    """What is known of one plugin: where it came from and whether it loaded.

    ``status`` is ``"loaded"``, ``"failed"`` (import error, bad hooks, malformed
    declarations), ``"incompatible"`` (targets a plugin API newer than this core) or
    ``"disabled"`` (by an environment variable). ``api`` is the plugin-API version the
    plugin targets; ``warnings`` are problems that did not stop it loading.
    """

    name: str
    distribution: str | None
    version: str | None
    status: str
    quantizers: tuple[str, ...] = ()
    error: str | None = None
    api: int | None = None
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "api": self.api,
            "quantizers": list(self.quantizers),
            "error": self.error,
            "warnings": list(self.warnings),
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


class _Failure(Exception):
    """Internal: why a plugin was not loaded (status and reason), with the original error."""

    def __init__(self, status: str, reason: str, cause: BaseException | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.cause = status, reason, cause


class PluginManager:
    """Loads plugins and answers registry queries.

    ``entry_points``: the entry points to consider (default: those installed, group
    ``quantweave``). ``environ``: where the ``QUANTWEAVE_*`` variables are read (default
    ``os.environ``). ``strict``: overrides ``QUANTWEAVE_STRICT_PLUGINS``.

    :attr:`api_version` and :attr:`hookspecs` are what this core implements; a test may
    subclass to simulate a newer core (more hooks, more hook arguments via
    :meth:`hook_arguments`): hooks are called through pluggy, so a plugin written for an
    older API, whose implementations take fewer arguments, keeps working.
    """

    api_version: int = PLUGIN_API_VERSION
    hookspecs: type = QuantweaveHookSpecs

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
        self._pm.add_hookspecs(self.hookspecs)
        self._pm.register(CORE, name=CORE_NAME)  # the core patterns, through the plugins' own hook
        self._core: dict[str, PatternSpec] | None = None
        self._records: dict[str, PluginRecord] = {}
        self._infos: dict[str, dict[str, QuantizerInfo]] = {}  # plugin -> quantizer name -> info
        self._offered: dict[str, list[PatternSpec]] = {}  # plugin -> patterns it contributes
        self._patterns: dict[str, PatternSpec] = {}  # accepted contributed patterns
        self._loaded = False

    # -- loading --------------------------------------------------------------------------

    @property
    def strict(self) -> bool:
        if self._strict is not None:
            return self._strict
        return _flag(self._environ, ENV_STRICT, STRICT_VALUES)

    def hook_arguments(self, hook: str) -> dict[str, Any]:
        """The keyword arguments this core passes to ``hook`` (none in plugin API 1..2)."""
        return {}

    def load(self) -> None:
        """Load every entry point once (called by every query).

        Every entry point is tried and recorded before anything is raised, so with
        ``strict`` the first failure is raised *after* the registry is complete: later
        queries see every plugin, the failed ones included."""
        if self._loaded:
            return
        _ = self.strict  # a QUANTWEAVE_STRICT_PLUGINS value not understood raises before anything loads
        self._loaded = True
        entry_points = _installed_entry_points() if self._entry_points is None else self._entry_points
        disabled = _names(self._environ.get(ENV_DISABLE))
        allowed = _names(self._environ.get(ENV_LOAD)) if ENV_LOAD in self._environ else None
        seen: dict[str, str] = {}
        failures: list[tuple[str, BaseException | None]] = []
        for ep in entry_points:
            where = _dist(ep)
            if ep.name in seen:
                if seen[ep.name] != ep.value:
                    message = self._message(
                        ep.name,
                        where,
                        f"duplicate plugin name {ep.name!r}: {ep.value!r} ignored, {seen[ep.name]!r} already loaded",
                    )
                    failures.append((message, None))
                continue  # the same entry point listed twice (e.g. a path on sys.path twice)
            seen[ep.name] = ep.value
            if ep.name in disabled or (allowed is not None and ep.name not in allowed):
                why = f"disabled by {ENV_DISABLE}" if ep.name in disabled else f"not listed in {ENV_LOAD}"
                self._records[ep.name] = PluginRecord(ep.name, *where, "disabled", error=why)
                continue
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as exc:  # a plugin must never take the host down
                failure = _Failure("failed", f"import failed: {type(exc).__name__}: {exc}", exc)
                failures.append(self._record_failure(ep.name, where, failure))
                continue
            failures += self._register(ep.name, plugin, where)
        self._warn_unknown_names(set(seen), disabled, allowed)
        failures += self._settle()
        self._report(failures)

    def _warn_unknown_names(self, installed: set[str], disabled: set[str], allowed: set[str] | None) -> None:
        """A name in QUANTWEAVE_DISABLE_PLUGINS / QUANTWEAVE_LOAD_PLUGINS that is no installed
        plugin is most likely a typo (or a quantizer or distribution name): say so."""
        known = ", ".join(sorted(installed)) or "none"
        for variable, names in ((ENV_DISABLE, disabled), (ENV_LOAD, allowed or set())):
            for name in sorted(names - installed):
                separator = " (separate plugin names with commas)" if re.search(r"[\s;:|]", name) else ""
                warnings.warn(
                    f"{variable} names {name!r}, which is not an installed quantweave plugin (installed plugins: "
                    f"{known}){separator}; it has no effect",
                    PluginWarning,
                    stacklevel=4,
                )

    def register(
        self, name: str, plugin: object, *, distribution: str | None = None, version: str | None = None
    ) -> PluginRecord:
        """Register a plugin object (module or instance) under ``name``; returns its record.

        Used directly by tests and in-process plugins (the entry-point loader does the same
        for every installed plugin)."""
        self.load()
        if name in self._records and self._records[name].status == "loaded":
            reason = f"a plugin named {name!r} is already registered"
            self._report([(self._message(name, (distribution, version), reason), None)])
            return PluginRecord(name, distribution, version, "failed", error=reason)
        failures = self._register(name, plugin, (distribution, version))
        failures += self._settle()
        self._report(failures)
        return self._records.get(name) or PluginRecord(name, distribution, version, "failed", error=failures[0][0])

    def _register(
        self, name: str, plugin: object, where: tuple[str | None, str | None]
    ) -> list[tuple[str, BaseException | None]]:
        api = getattr(plugin, "QUANTWEAVE_PLUGIN_API", None)
        try:
            self._check_api(api, where)
            try:
                self._pm.register(plugin, name=name)
                self._pm.check_pending()
            except Exception as exc:
                self._unregister(plugin)
                raise _Failure("failed", f"invalid hooks: {exc}", exc) from exc
            try:
                infos = self._collect_quantizers(plugin)
                patterns = self._collect_patterns(plugin)
            except _Failure:
                self._unregister(plugin)
                raise
        except _Failure as failure:
            return [self._record_failure(name, where, failure, api if isinstance(api, int) else None)]
        self._infos[name] = infos
        self._offered[name] = patterns
        self._records[name] = PluginRecord(name, *where, "loaded", tuple(infos), api=api)
        return []

    def _check_api(self, api: object, where: tuple[str | None, str | None]) -> None:
        if api is None:
            raise _Failure("failed", "does not declare QUANTWEAVE_PLUGIN_API (the plugin-API version it targets)")
        if not isinstance(api, int) or isinstance(api, bool) or api < 1:
            raise _Failure(
                "failed", f"declares plugin API {api!r}; expected a whole number from 1 to {self.api_version}"
            )
        if api > self.api_version:
            raise _Failure(
                "incompatible",
                f"declares plugin API {api}, but this quantweave {_core_version()} implements plugin API "
                f"1..{self.api_version}; {_upgrade_hint(api, where[0])}",
            )

    def _unregister(self, plugin: object) -> None:
        if self._pm.is_registered(plugin):
            self._pm.unregister(plugin)

    def _call(self, hook: str, plugin: object) -> list[Any]:
        """Call ``hook`` on ``plugin`` alone, through pluggy (an implementation receives the
        subset of :meth:`hook_arguments` it names)."""
        others = [p for p in self._pm.get_plugins() if p is not plugin]
        caller = self._pm.subset_hook_caller(hook, remove_plugins=others)
        try:
            return list(caller(**self.hook_arguments(hook)))
        except Exception as exc:
            raise _Failure("failed", f"{hook}() failed: {type(exc).__name__}: {exc}", exc) from exc

    def _collect_quantizers(self, plugin: object) -> dict[str, QuantizerInfo]:
        infos: dict[str, QuantizerInfo] = {}
        for result in self._call("quantweave_quantizers", plugin):
            if not isinstance(result, (list, tuple)):
                raise _Failure(
                    "failed",
                    f"quantweave_quantizers() must return a list of QuantizerInfo; got {type(result).__name__}",
                )
            for info in result:
                if not isinstance(info, QuantizerInfo):
                    raise _Failure(
                        "failed", f"quantweave_quantizers(): expected QuantizerInfo items; got {type(info).__name__}"
                    )
                if info.name in infos:
                    raise _Failure("failed", f"quantweave_quantizers(): quantizer name {info.name!r} is declared twice")
                infos[info.name] = info
        return infos

    def _collect_patterns(self, plugin: object) -> list[PatternSpec]:
        patterns: list[PatternSpec] = []
        for result in self._call("quantweave_patterns", plugin):
            if not isinstance(result, (list, tuple)) or not all(isinstance(p, PatternSpec) for p in result):
                raise _Failure("failed", f"quantweave_patterns() must return a list of PatternSpec; got {result!r}")
            patterns += result
        names = [p.name for p in patterns]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise _Failure("failed", f"quantweave_patterns(): pattern(s) contributed twice: {', '.join(twice)}")
        return patterns

    def _settle(self) -> list[tuple[str, BaseException | None]]:
        """Accept contributed patterns (first plugin by name wins a clash) and check that
        every loaded plugin declares capabilities only for known patterns."""
        core = set(self._core_patterns())
        accepted: dict[str, PatternSpec] = {}
        notes: dict[str, list[str]] = {}
        for name in sorted(self._offered):
            for spec in self._offered[name]:
                if spec.name in core:
                    notes.setdefault(name, []).append(
                        f"pattern {spec.name!r} it contributes is a core pattern; its definition is ignored"
                    )
                elif spec.name in accepted:
                    owner = accepted[spec.name].origin
                    notes.setdefault(name, []).append(
                        f"pattern {spec.name!r} it contributes clashes with plugin {owner!r}'s; "
                        f"{owner!r}'s definition is used"
                    )
                else:
                    accepted[spec.name] = replace(spec, origin=name)
        failures: list[tuple[str, BaseException | None]] = []
        for name in sorted(self._infos):
            record = self._records[name]
            unknown = sorted(
                {c.pattern for info in self._infos[name].values() for c in info.capabilities} - core - set(accepted)
            )
            if unknown:
                failure = _Failure(
                    "failed",
                    f"declares capabilities for pattern(s) {', '.join(unknown)}, which are neither core patterns "
                    "(quantweave.vocabulary.PATTERNS) nor contributed by a loaded plugin (quantweave_patterns hook)",
                )
                failures.append(self._record_failure(name, (record.distribution, record.version), failure, record.api))
                continue
            self._infos[name] = {q: _with_ops(info, accepted) for q, info in self._infos[name].items()}
            new_notes = tuple(n for n in notes.get(name, []) if n not in record.warnings)
            if new_notes:
                self._records[name] = replace(record, warnings=record.warnings + new_notes)
                for note in new_notes:
                    warnings.warn(
                        self._message(name, (record.distribution, record.version), note, loaded=True),
                        PluginWarning,
                        stacklevel=4,
                    )
        self._patterns = accepted
        return failures

    def _record_failure(
        self, name: str, where: tuple[str | None, str | None], failure: _Failure, api: int | None = None
    ) -> tuple[str, BaseException | None]:
        self._infos.pop(name, None)
        self._offered.pop(name, None)
        self._records[name] = PluginRecord(name, *where, failure.status, error=failure.reason, api=api)
        return self._message(name, where, failure.reason), failure.cause

    @staticmethod
    def _message(name: str, where: tuple[str | None, str | None], reason: str, loaded: bool = False) -> str:
        dist, version = where
        origin = f" ({dist} {version})" if dist else ""
        return f"quantweave plugin {name!r}{origin} {'loaded with a problem' if loaded else 'was not loaded'}: {reason}"

    def _report(self, failures: list[tuple[str, BaseException | None]]) -> None:
        if not failures:
            return
        if self.strict:
            message, cause = failures[0]
            more = f" (and {len(failures) - 1} more: see quantweave.plugins())" if len(failures) > 1 else ""
            raise PluginError(message + more) from cause
        for message, _ in failures:
            warnings.warn(message, PluginWarning, stacklevel=4)

    # -- queries --------------------------------------------------------------------------

    def plugins(self) -> list[PluginRecord]:
        """Every plugin seen: loaded, failed and disabled, sorted by name."""
        self.load()
        return [self._records[name] for name in sorted(self._records)]

    def patterns(self) -> dict[str, PatternSpec]:
        """The pattern vocabulary: core patterns and those loaded plugins contribute
        (``origin`` says which), by name."""
        self.load()
        return {**self._core_patterns(), **self._patterns}

    def vocabulary(self) -> Vocabulary:
        """:meth:`patterns` as one :class:`~quantweave.vocabulary.Vocabulary` (what the
        conformance kit, compositions and the report take)."""
        return Vocabulary(self.patterns())

    def _core_patterns(self) -> dict[str, PatternSpec]:
        """The patterns the core contributes through its own ``quantweave_patterns``."""
        if self._core is None:
            self._core = {spec.name: spec for result in self._call("quantweave_patterns", CORE) for spec in result}
        return dict(self._core)

    def quantizer_infos(self) -> dict[str, QuantizerInfo]:
        """Every available quantizer under its qualified name ``"<plugin>:<quantizer>"``."""
        self.load()
        return {
            f"{plugin}:{name}": info for plugin, infos in sorted(self._infos.items()) for name, info in infos.items()
        }

    def resolve(self, name: str) -> tuple[str, QuantizerInfo]:
        """``(plugin, info)`` for a bare or qualified quantizer name."""
        infos = self.quantizer_infos()
        if not isinstance(name, str):
            hint = ""
            if isinstance(name, (Quantizer, type)):
                hint = " (get_quantizer builds a quantizer from its name: pass a quantizer you have directly)"
            raise TypeError(
                f"quantizer name must be a str such as 'x86' or 'x86:x86'; got {type(name).__name__} {name!r}{hint}; "
                f"available: {', '.join(sorted(infos)) or 'none'}"
            )
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
        plugin_name = name.split(":", 1)[0]
        record = self._records.get(plugin_name)
        if record is not None and record.status != "loaded":
            if record.status == "disabled":
                how = (
                    f"unset {ENV_DISABLE} or remove {plugin_name!r} from it"
                    if ENV_DISABLE in (record.error or "")
                    else f"add {plugin_name!r} to {ENV_LOAD}"
                )
                raise UnknownQuantizerError(
                    f"no quantizer named {name!r} is available: plugin {plugin_name!r} is {record.error} "
                    f"(to load it, {how}); available: {available}"
                )
            raise UnknownQuantizerError(
                f"no quantizer named {name!r} is available: plugin {plugin_name!r} was not loaded ({record.status}: "
                f"{record.error}); available: {available}"
            )
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
        if isinstance(quantizer, type):
            raise PluginError(
                f"quantizer {plugin}:{info.name}: factory returned the class {quantizer.__name__}, not an instance "
                f"(plugin {plugin!r}: the factory must build one, e.g. return {quantizer.__name__}(**options))"
            )
        if not isinstance(quantizer, Quantizer) and not is_pt2e_quantizer(quantizer):
            raise PluginError(
                f"quantizer {plugin}:{info.name}: factory returned {type(quantizer).__name__}, "
                "expected a quantweave.Quantizer (or an object with the PT2E quantizer hooks)"
            )
        with contextlib.suppress(AttributeError):  # provenance, read by ComposableQuantizer
            quantizer.plugin = plugin
        return quantizer

    def quantization_capabilities(
        self, *, plugin: str | None = None, mode: Mode | str | None = None, derive: bool = True
    ) -> list[Capability]:
        """Declared capabilities of every loaded quantizer, with provenance filled in; for a
        quantizer that declares none, with ``derive`` the capabilities probing derives
        (``source="derived"``; its factory is built with no options and with each
        ``mode_options`` entry)."""
        wanted_mode = None if mode is None else Mode(mode)
        caps = []
        for qualified, info in self.quantizer_infos().items():
            owner = qualified.split(":", 1)[0]
            if plugin is not None and owner != plugin:
                continue
            for cap in info.capabilities or (derived_for_info(info) if derive else ()):
                if wanted_mode is None or cap.mode is wanted_mode:
                    caps.append(cap.with_provenance(owner, info.name))
        return sort_capabilities(caps)


def _with_ops(info: QuantizerInfo, contributed: Mapping[str, PatternSpec]) -> QuantizerInfo:
    """``info`` with the ops of contributed patterns filled into its capabilities."""
    if all(c.ops for c in info.capabilities):
        return info
    caps = tuple(
        replace(c, ops=contributed[c.pattern].ops) if not c.ops and c.pattern in contributed else c
        for c in info.capabilities
    )
    return replace(info, capabilities=caps)


def _core_version() -> str:
    from . import __version__

    return str(__version__)


def _upgrade_hint(api: int, distribution: str | None) -> str:
    """What would load a plugin targeting ``api``: a known release, or its own requirement."""
    if api in PLUGIN_API_RELEASES:
        return f"quantweave>={PLUGIN_API_RELEASES[api][0]} loads it"
    if distribution:
        try:
            requires = importlib.metadata.distribution(distribution).requires or []
        except importlib.metadata.PackageNotFoundError:
            requires = []
        wanted = [r.split(";")[0].strip() for r in requires if re.match(r"^quantweave\s*[<>=!~(]", r)]
        if wanted:
            return f"{distribution} requires {wanted[0]}: install a quantweave release that satisfies it"
    return f"it needs a newer quantweave, one implementing plugin API {api}"


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

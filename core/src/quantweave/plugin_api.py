"""The plugin contract: everything a quantweave plugin needs, in one leaf module.

A plugin is a module (or object) registered under the entry-point group ``quantweave``::

    # pyproject.toml of the plugin distribution
    [project.entry-points.quantweave]
    myplugin = "quantweave_myplugin.plugin"

    # quantweave_myplugin/plugin.py
    from quantweave.plugin_api import Capability, Mode, QuantizerInfo, hookimpl

    QUANTWEAVE_PLUGIN_API = 2  # the plugin-API version this plugin was written for

    @hookimpl
    def quantweave_quantizers():
        return [QuantizerInfo(name="myq", factory=MyQuantizer, capabilities=...)]

This module imports neither the loader (:mod:`quantweave.registry`) nor pluggy: importing
it is what a plugin pays at discovery time, and it can never take part in an import cycle.

**Compatibility policy.** A core implementing plugin API ``N`` loads plugins that target
any API ``1..N``: hooks and hook arguments are only ever *added*; hooks are called through
pluggy, so an implementation may accept any subset of its hook's arguments, and a newer
core may pass more. A plugin targeting an API newer than the core is reported
``incompatible`` (both numbers, and the core release that introduced its API when known).
The distribution range follows the API: the core's ``0.1`` series keeps every plugin API
it ever shipped, so a plugin depends on ``quantweave>=<release that introduced the API it
targets>,<0.2`` (see :data:`PLUGIN_API_RELEASES`).

**The annotation protocol** (the ``node.meta`` keys quantizers and the core share) is
re-exported here: :data:`ANNOTATION_KEY`, :data:`SKIP_REASON_KEY`,
:data:`ANNOTATED_BY_KEY`, :func:`mark_annotated`, :func:`set_skip_reason`,
:func:`is_annotated`.

**Options that select by module** (``set_module_name``, ``set_module_type``) call
:func:`warn_unknown_modules` from ``annotate``: a name or type no node of the model was
traced in is warned about (:class:`~quantweave.errors.MisuseWarning`) with close matches.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._modules.module_names import warn_unknown_modules
from .annotation import (
    ANNOTATED_BY_KEY,
    ANNOTATION_KEY,
    SKIP_REASON_KEY,
    is_annotated,
    mark_annotated,
    set_skip_reason,
)
from .capabilities import FLOAT, Capability, Mode, PatternSpec, Quant, TensorQuant
from .quantizer import Quantizer

__all__ = [
    "ANNOTATED_BY_KEY",
    "ANNOTATION_KEY",
    "PLUGIN_API_RELEASES",
    "PLUGIN_API_VERSION",
    "PROJECT",
    "SKIP_REASON_KEY",
    "FLOAT",
    "Capability",
    "Mode",
    "PatternSpec",
    "Quant",
    "Quantizer",
    "QuantizerInfo",
    "TensorQuant",
    "hookimpl",
    "is_annotated",
    "mark_annotated",
    "set_skip_reason",
    "warn_unknown_modules",
]

#: The entry-point group, and the pluggy project name.
PROJECT = "quantweave"
#: The plugin-API version this core implements (it loads plugins targeting 1..this).
PLUGIN_API_VERSION = 2
#: Plugin-API version -> the first quantweave release implementing it, and what it added.
PLUGIN_API_RELEASES: dict[int, tuple[str, str]] = {
    1: ("0.1.0", "hook quantweave_quantizers(); QuantizerInfo; Capability/TensorQuant declarations"),
    2: (
        "0.1.1",
        "hook quantweave_patterns() (plugins extend the pattern vocabulary); quantweave.plugin_api; "
        "mark_annotated / set_skip_reason / ANNOTATED_BY_KEY",
    ),
}

_F = TypeVar("_F", bound=Callable[..., Any])


class HookimplMarker:
    """Marks a function as the implementation of a quantweave hook.

    ``@hookimpl`` or ``@hookimpl(tryfirst=True)``. The mark is the attribute
    ``quantweave_impl`` that pluggy's plugin manager reads (the same mark
    ``pluggy.HookimplMarker("quantweave")`` makes), so this module needs no pluggy import.
    """

    project_name = PROJECT

    def __call__(
        self,
        function: _F | None = None,
        *,
        tryfirst: bool = False,
        trylast: bool = False,
        optionalhook: bool = False,
        specname: str | None = None,
    ) -> Any:
        options = {"tryfirst": tryfirst, "trylast": trylast, "optionalhook": optionalhook, "specname": specname}

        def mark(func: _F) -> _F:
            setattr(func, f"{self.project_name}_impl", dict(options))
            return func

        return mark if function is None else mark(function)


hookimpl = HookimplMarker()

_NAME = re.compile(r"^[a-z][a-z0-9_.-]*$")


@dataclass(frozen=True)
class QuantizerInfo:
    """A quantizer a plugin provides (returned by the ``quantweave_quantizers`` hook).

    ``factory(**options)`` builds a configured :class:`~quantweave.Quantizer`.
    ``capabilities`` are the declared (pattern, mode) records; they must pass the
    conformance kit. ``mode_options`` gives, for each declared mode other than ``static``,
    the factory options that configure the quantizer for that mode
    (e.g. ``{"dynamic": {"is_dynamic": True}}``).
    """

    name: str
    factory: Callable[..., Quantizer]
    capabilities: tuple[Capability, ...] = ()
    description: str = ""
    mode_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(
                f"QuantizerInfo: name must be lower-case letters, digits, '_', '-' or '.', starting with a "
                f"letter; got {self.name!r}"
            )
        if not callable(self.factory):
            raise ValueError(f"QuantizerInfo {self.name!r}: factory must be callable; got {self.factory!r}")
        caps = tuple(self.capabilities)
        for cap in caps:
            if not isinstance(cap, Capability):
                raise ValueError(
                    f"QuantizerInfo {self.name!r}: capabilities must be Capability records; got {type(cap).__name__}"
                )
        object.__setattr__(self, "capabilities", caps)
        if not isinstance(self.mode_options, Mapping):
            raise ValueError(
                f"QuantizerInfo {self.name!r}: mode_options must map a mode name to factory options; "
                f"got {type(self.mode_options).__name__}"
            )
        modes = set()
        for mode, options in self.mode_options.items():
            try:
                modes.add(Mode(mode))
            except ValueError:
                known = ", ".join(m.value for m in Mode)
                raise ValueError(
                    f"QuantizerInfo {self.name!r}: mode_options has unknown mode {mode!r}; expected one of {known}"
                ) from None
            if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
                raise ValueError(
                    f"QuantizerInfo {self.name!r}: mode_options[{mode!r}] must map option names to values; "
                    f"got {options!r}"
                )
        for cap in caps:
            if cap.mode is not Mode.STATIC and cap.mode not in modes:
                raise ValueError(
                    f"QuantizerInfo {self.name!r}: declares {cap.pattern} in mode {cap.mode} but mode_options "
                    f"has no {cap.mode.value!r} entry saying how to configure the quantizer for it"
                )

    def options_for(self, mode: Mode | str) -> dict[str, Any]:
        """Factory options that configure this quantizer for ``mode``."""
        return dict(self.mode_options.get(Mode(mode).value, {}))

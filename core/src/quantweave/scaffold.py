"""``quantweave new-plugin NAME [--dir DIR] [--force]``: generate a plugin project.

The project installs, passes its own tests (quantweave's conformance kit, through the
pytest plugin pytest-quantweave: one line) and builds a wheel without edits, from a
checkout of quantweave (``QUANTWEAVE_SOURCE``, see the generated README) or an index:
``pyproject.toml`` with the ``quantweave`` entry point and the
dependency range of the plugin API it targets, a package with one quantizer and its
declared capabilities, ``py.typed``, a conformance test, a ``tox.ini`` pinning torch, a
README and a LICENSE placeholder. The templates are package data (``quantweave/_scaffold``).

For a plugin named ``acme``: distribution ``quantweave-acme``, package
``quantweave_acme``, entry point ``acme = "quantweave_acme.plugin"``, quantizer ``acme``
(class ``AcmeQuantizer``), directory ``./quantweave-acme`` unless ``--dir`` is given.
The names of quantweave's own plugins (:data:`FIRST_PARTY`) are refused unless forced.
contrib/template in quantweave's repository is this scaffold's output for ``template``
(tests/core/test_scaffold_template.py keeps them the same).
"""

from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .plugin_api import PLUGIN_API_RELEASES, PLUGIN_API_VERSION

__all__ = ["FIRST_PARTY", "PluginNames", "ScaffoldError", "new_plugin", "plugin_names"]

_NAME = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")
_MAX_LENGTH = 40
#: Plugin names of quantweave's own distributions (quantweave-<name>): generated only with ``force``.
FIRST_PARTY = frozenset({"x86", "xnnpack", "embedding", "executorch", "onnxruntime", "vendors", "litert"})

#: generated path (relative to the project directory) -> template file in quantweave/_scaffold
_FILES: dict[str, str] = {
    "pyproject.toml": "pyproject.toml.tmpl",
    "README.md": "README.md.tmpl",
    "LICENSE": "LICENSE.tmpl",
    "tox.ini": "tox.ini.tmpl",
    ".gitignore": "gitignore.tmpl",
    "src/{package}/__init__.py": "init.py.tmpl",
    "src/{package}/plugin.py": "plugin.py.tmpl",
    "src/{package}/quantizer.py": "quantizer.py.tmpl",
    "src/{package}/py.typed": "",
    "tests/test_conformance.py": "test_conformance.py.tmpl",
}


class ScaffoldError(ValueError):
    """A plugin name or target directory ``new-plugin`` cannot use (the message says why)."""


@dataclass(frozen=True)
class PluginNames:
    """The names a plugin project is generated with."""

    name: str  # entry-point and quantizer name
    dist: str  # distribution (what pip installs)
    package: str  # import package
    class_name: str  # the quantizer class


def plugin_names(name: str) -> PluginNames:
    """Validate ``name`` and derive the project's names from it (raises :class:`ScaffoldError`)."""
    allowed = (
        "lower-case letters and digits, words separated by single '-' or '_', starting with a letter, "
        f"at most {_MAX_LENGTH} characters (e.g. 'acme' or 'my-npu')"
    )
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > _MAX_LENGTH:
        raise ScaffoldError(f"invalid plugin name {name!r}: use {allowed}")
    if name.startswith("quantweave"):
        raise ScaffoldError(
            f"invalid plugin name {name!r}: give the plugin's own name (e.g. 'acme'); the distribution is "
            "named quantweave-<name> and the package quantweave_<name>"
        )
    words = re.split(r"[-_]", name)
    package = "quantweave_" + "_".join(words)
    class_name = "".join(w.capitalize() for w in words) + "Quantizer"
    return PluginNames(name=name, dist=f"quantweave-{'-'.join(words)}", package=package, class_name=class_name)


def _render(template: str, names: PluginNames) -> str:
    from . import __version__

    api_release = PLUGIN_API_RELEASES[PLUGIN_API_VERSION][0]
    text = resources.files("quantweave._scaffold").joinpath(template).read_text(encoding="utf-8")
    return string.Template(text).substitute(
        name=names.name,
        dist=names.dist,
        dist_underscored=names.dist.replace("-", "_"),
        package=names.package,
        class_name=names.class_name,
        api=PLUGIN_API_VERSION,
        api_release=api_release,
        core_version=__version__,
    )


def new_plugin(name: str, directory: str | os.PathLike[str] | None = None, *, force: bool = False) -> list[Path]:
    """Generate the plugin project for ``name`` in ``directory`` (default
    ``./quantweave-<name>``); returns the files written. Refuses a directory that exists
    and is not empty, a path that is a file, and (unless ``force``) the name of one of
    quantweave's own plugins."""
    names = plugin_names(name)
    if names.name.replace("_", "-") in FIRST_PARTY and not force:
        raise ScaffoldError(
            f"plugin name {name!r} is taken by quantweave's own plugin {names.dist}: a project named so would install "
            "over it and claim its entry point; choose another name (e.g. 'acme-" + names.name + "'), or pass "
            "--force (new_plugin(..., force=True)) to generate it anyway"
        )
    root = Path(names.dist if directory is None else directory)
    if root.exists() and not root.is_dir():
        raise ScaffoldError(f"{root} exists and is not a directory")
    if root.is_dir() and any(root.iterdir()):
        raise ScaffoldError(f"{root} exists and is not empty; choose another --dir or remove it")
    written = []
    for relative, template in _FILES.items():
        path = root / relative.format(package=names.package)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_render(template, names) if template else "", encoding="utf-8")
        written.append(path)
    return written

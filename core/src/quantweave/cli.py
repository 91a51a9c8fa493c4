"""The ``quantweave`` command (also ``python -m quantweave``).

``quantweave plugins [--json]``: installed plugins with status, distribution, version,
quantizers and, for failures, the reason.

``quantweave capabilities [--plugin NAME] [--mode MODE] [--json] [--details]``: a pattern x
quantizer table of declared capabilities (cells list the modes), one row per capability
with everything it states (``--details``), or the records as JSON.

``quantweave new-plugin NAME [--dir DIR]``: generate a plugin project (see
:mod:`quantweave.scaffold`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ._modules.text import render_table
from .capabilities import Mode
from .registry import PluginManager, default_manager


def render_plugins(manager: PluginManager, as_json: bool) -> str:
    records = manager.plugins()
    if as_json:
        return json.dumps([r.to_dict() for r in records], indent=2)
    if not records:
        return "no quantweave plugins installed (entry-point group 'quantweave')"
    rows = [
        [
            r.name,
            r.status,
            "-" if r.api is None else str(r.api),
            r.distribution or "-",
            r.version or "-",
            ", ".join(r.quantizers) or "-",
            "; ".join([r.error] if r.error else list(r.warnings)),
        ]
        for r in records
    ]
    return render_table(["plugin", "status", "api", "distribution", "version", "quantizers", "error"], rows)


def render_capabilities(
    manager: PluginManager, plugin: str | None, mode: str | None, as_json: bool, details: bool = False
) -> str:
    caps = manager.quantization_capabilities(plugin=plugin, mode=mode)
    vocabulary = manager.patterns()
    if details and not as_json and caps:
        header = ["pattern", "mode", "quantizer", "activation", "weight", "bias", "output", "fused", "when"]
        rows = []
        for c in caps:
            d = c.describe()
            who = f"{c.plugin}:{c.quantizer}"
            row = [c.pattern, c.mode.value, who, d["activation"], d["weight"], d["bias"], d["output"]]
            rows.append([*row, d["fused"], d["when"]])
        legend = (
            "activation/weight/bias: dtype[qmin,qmax] granularity (axis) sym|affine; output: own (its own qparams), "
            "shared with input N, fixed scale/zero_point, or float; '?': not stated by the plugin"
        )
        return render_table(header, rows) + "\n" + legend
    if as_json:
        return json.dumps([{**c.to_dict(), "pattern_origin": vocabulary[c.pattern].origin} for c in caps], indent=2)
    if not caps:
        return (
            "no capabilities declared"
            + (f" for plugin {plugin!r}" if plugin else "")
            + (f" in mode {mode}" if mode else "")
        )
    quantizers = sorted({f"{c.plugin}:{c.quantizer}" for c in caps})
    patterns = sorted({c.pattern for c in caps})
    cells: dict[tuple[str, str], list[str]] = {}
    for c in caps:
        cells.setdefault((c.pattern, f"{c.plugin}:{c.quantizer}"), []).append(c.mode.value)
    order = [m.value for m in Mode]
    rows = [
        [
            pattern,
            vocabulary[pattern].origin,
            *(",".join(sorted(cells.get((pattern, q), []), key=order.index)) or "-" for q in quantizers),
        ]
        for pattern in patterns
    ]
    return render_table(["pattern", "origin", *quantizers], rows)


def main(argv: Sequence[str] | None = None, manager: PluginManager | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quantweave", description="PT2E quantization plugins and capabilities")
    sub = parser.add_subparsers(dest="command", required=True)
    p_plugins = sub.add_parser("plugins", help="list installed plugins and their status")
    p_plugins.add_argument("--json", action="store_true", help="print JSON")
    p_caps = sub.add_parser("capabilities", help="pattern x quantizer table of declared capabilities")
    p_caps.add_argument("--plugin", help="only this plugin")
    p_caps.add_argument("--mode", choices=[m.value for m in Mode], help="only this mode")
    p_caps.add_argument("--json", action="store_true", help="print JSON records")
    p_caps.add_argument(
        "--details", action="store_true", help="one row per capability: inputs, weight, bias, output, fusion"
    )
    p_new = sub.add_parser("new-plugin", help="generate a plugin project (package, quantizer, tests, pyproject)")
    p_new.add_argument("name", help="the plugin's name, e.g. 'acme' (distribution quantweave-acme)")
    p_new.add_argument("--dir", help="where to generate it (default: ./quantweave-NAME); must be absent or empty")
    args = parser.parse_args(argv)
    if args.command == "new-plugin":
        return _new_plugin(args.name, args.dir)
    manager = manager or default_manager()
    if args.command == "plugins":
        print(render_plugins(manager, args.json))
        return 0
    if args.plugin is not None and args.plugin not in {r.name for r in manager.plugins()}:
        known = ", ".join(r.name for r in manager.plugins()) or "none"
        print(f"quantweave: no plugin named {args.plugin!r}; installed: {known}", file=sys.stderr)
        return 2
    print(render_capabilities(manager, args.plugin, args.mode, args.json, args.details))
    return 0


def _new_plugin(name: str, directory: str | None) -> int:
    from .scaffold import ScaffoldError, new_plugin, plugin_names

    try:
        written = new_plugin(name, directory)
    except ScaffoldError as exc:
        print(f"quantweave new-plugin: {exc}", file=sys.stderr)
        return 2
    names = plugin_names(name)
    root = written[0].parent
    print(f"created {names.dist} in {root} (package {names.package}, entry point {names.name}):")
    for path in written:
        print(f"  {path.relative_to(root)}")
    print(f"next: cd {root} && pip install torch==2.13.0 && pip install -e '.[test]' && pytest")
    return 0

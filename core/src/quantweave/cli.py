"""The ``quantweave`` command (also ``python -m quantweave``).

``quantweave plugins [--json]``: installed plugins with status, distribution, version,
quantizers and, for failures, the reason.

``quantweave capabilities [--plugin NAME] [--mode MODE] [--json] [--details]``: a pattern x
quantizer table of declared capabilities (cells list the modes), one row per capability
with everything it states (``--details``), or the records as JSON. A quantizer that
declares none is shown with the capabilities probing derives, marked ``*`` (``source``
``"derived"`` in JSON).

``quantweave --version``: the versions of quantweave (and its plugin API), torch, and each
plugin's distribution.

``quantweave new-plugin NAME [--dir DIR] [--force]``: generate a plugin project (see
:mod:`quantweave.scaffold`).

``quantweave compare MODEL --quantizer NAME [--option KEY=VALUE ...] [--calibration-batches N]
[--compare-batches N] [--top N] [--json]``: quantize a model with an installed quantizer
and show the numeric debugger (:func:`quantweave.compare`) in the annotation report: every
node quantized or float (by whom, why), the compared ones with their op / model SQNR and
max error, worst first. ``MODEL`` is ``path/to/file.py:function`` (its folder first on
``sys.path`` during the run, as with ``python path/to/file.py``) or
``package.module:function``; the function takes no arguments and returns ``(model,
batches)``: a float ``nn.Module`` (exported on the first batch, in eval mode) or the
``torch.export(...).module()`` GraphModule, and a list of batches (tuples of model
arguments, or tensors; one tuple is one batch), used to calibrate and then to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ._modules.cli_factory import CompareError
from ._modules.cli_factory import call_factory as _call_factory
from ._modules.cli_factory import load_factory as _load_factory
from ._modules.cli_factory import parse_options as _parse_options
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


_DERIVED_MARK = {"declared": "", "derived": "*"}


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
            who = f"{c.plugin}:{c.quantizer}" + (" (derived)" if c.source == "derived" else "")
            row = [c.pattern, c.mode.value, who, d["activation"], d["weight"], d["bias"], d["output"]]
            rows.append([*row, d["fused"], d["when"]])
        legend = (
            "quantizer: plugin:quantizer; activation/weight/bias: dtype[qmin,qmax] granularity (axis) sym|affine; "
            "output: own (its own qparams), shared with input N, fixed scale/zero_point, or float; "
            "'?': not stated by the plugin"
        )
        if any(c.source == "derived" for c in caps):
            legend += "; (derived): read off what a quantizer declaring none annotates on the conformance probes"
        return render_table(header, rows) + "\n" + legend
    if as_json:
        return json.dumps([{**c.to_dict(), "pattern_origin": vocabulary[c.pattern].origin} for c in caps], indent=2)
    if not caps:
        return (
            "no capabilities declared"
            + (f" for plugin {plugin!r}" if plugin else "")
            + (f" in mode {mode}" if mode else "")
        )
    quantizers = sorted({(c.plugin, c.quantizer) for c in caps})
    names = [q for _, q in quantizers]
    # a column is headed by the quantizer's name (what get_quantizer takes), qualified only if two plugins share it
    columns = {pq: pq[1] if names.count(pq[1]) == 1 else f"{pq[0]}:{pq[1]}" for pq in quantizers}
    patterns = sorted({c.pattern for c in caps})
    cells: dict[tuple[str, tuple[str, str]], list[str]] = {}
    for c in caps:
        cells.setdefault((c.pattern, (c.plugin, c.quantizer)), []).append(c.mode.value + _DERIVED_MARK[c.source])
    order = [m.value for m in Mode]
    rows = [
        [
            pattern,
            vocabulary[pattern].origin,
            *(
                ",".join(sorted(cells.get((pattern, q), []), key=lambda m: order.index(m.rstrip("*")))) or "-"
                for q in quantizers
            ),
        ]
        for pattern in patterns
    ]
    records = {r.name: r for r in manager.plugins()}
    width = max(len(c) for c in columns.values())
    notes = ["columns (quantizer, as get_quantizer names it):"]
    for plugin, quantizer in quantizers:
        record = records.get(plugin)
        dist = f" ({record.distribution} {record.version})" if record is not None and record.distribution else ""
        notes.append(f"  {columns[(plugin, quantizer)]:<{width}}  quantizer {quantizer!r} of plugin {plugin!r}{dist}")
    notes += [
        "cells: the modes the quantizer declares for the pattern (static, dynamic, qat, weight_only); '-': none",
        "origin: 'core' (the vocabulary) or the plugin that contributed the pattern; one row per capability: --details",
    ]
    if any(c.source == "derived" for c in caps):
        notes.append("*: derived by probing (the quantizer declares no capabilities; read off what it annotates)")
    return "\n".join([render_table(["pattern", "origin", *columns.values()], rows), "", *notes])


def render_version(manager: PluginManager) -> str:
    """The core's version and plugin API, torch's, and each plugin's distribution and version."""
    import torch

    from ._modules.version import __version__
    from .plugin_api import PLUGIN_API_VERSION

    lines = [f"quantweave {__version__} (plugin API {PLUGIN_API_VERSION}, torch {torch.__version__})"]
    for r in manager.plugins():
        dist = f"{r.distribution} {r.version}" if r.distribution else "(not from a distribution)"
        lines.append(f"  plugin {r.name}: {dist}, {r.status}")
    if len(lines) == 1:
        lines.append("  no plugins installed (entry-point group 'quantweave')")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, manager: PluginManager | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="quantweave",
        description="quantweave: PT2E quantization on public torch. Lists the installed backend quantizer plugins "
        "and what each quantizer declares it quantizes.",
        epilog="Plugin loading: QUANTWEAVE_DISABLE_PLUGINS=a,b (skip these), QUANTWEAVE_LOAD_PLUGINS=a,b (only "
        "these), QUANTWEAVE_STRICT_PLUGINS=1 (raise on a plugin failure). Run 'quantweave COMMAND --help' for a "
        "command's options.",
    )
    parser.add_argument(
        "--version", action="store_true", help="print the versions of quantweave, torch and each plugin, and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_plugins = sub.add_parser(
        "plugins",
        help="list installed plugins and their status",
        description="Every plugin found under the entry-point group 'quantweave': its status (loaded, failed, "
        "incompatible, disabled), the plugin API it targets, its distribution and version, the quantizers it "
        "provides, and why it did not load.",
    )
    p_plugins.add_argument("--json", action="store_true", help="print JSON")
    p_caps = sub.add_parser(
        "capabilities",
        help="pattern x quantizer table of declared capabilities",
        description="Which patterns (conv2d_relu, linear, ...) each installed quantizer declares, in which modes "
        "(static, dynamic, qat, weight_only). --details: one row per capability with what it does to the whole "
        "pattern (inputs, weight, bias, output, fusion, when it applies).",
    )
    p_caps.add_argument("--plugin", help="only this plugin")
    p_caps.add_argument("--mode", choices=[m.value for m in Mode], help="only this mode")
    p_caps.add_argument("--json", action="store_true", help="print JSON records")
    p_caps.add_argument(
        "--details", action="store_true", help="one row per capability: inputs, weight, bias, output, fusion"
    )
    p_cmp = sub.add_parser(
        "compare",
        help="quantize a model and show per-node SQNR / max error (numeric debugger), worst first",
        description="Quantize MODEL with an installed quantizer (prepare, calibrate on the batches, convert), then "
        "compare the converted model with the float one op by op (quantweave.compare) and print the annotation "
        "report with each compared node's op SQNR, max error and model SQNR, worst first. MODEL is "
        "path/to/file.py:function or package.module:function; the function takes no arguments and returns "
        "(model, batches): a float nn.Module (exported on the first batch, in eval mode) or an exported "
        "GraphModule, and a list of batches (tuples of model arguments, or tensors).",
    )
    p_cmp.add_argument("model", metavar="MODEL", help="FILE.py:FUNCTION or MODULE:FUNCTION returning (model, batches)")
    p_cmp.add_argument("--quantizer", required=True, help="an installed quantizer (see 'quantweave plugins')")
    p_cmp.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a quantizer option (repeatable); VALUE is a Python literal (True, 0.5, 'x', [1, 2]) or a plain string",
    )
    p_cmp.add_argument("--calibration-batches", type=int, help="calibrate on the first N batches (default: all)")
    p_cmp.add_argument("--compare-batches", type=int, help="compare on the first N batches (default: all)")
    p_cmp.add_argument("--top", type=int, help="show at most N rows (the worst)")
    p_cmp.add_argument("--json", action="store_true", help="print JSON (the compare result and the report)")
    from .view import add_view_command, run_view_command

    add_view_command(sub)
    p_new = sub.add_parser("new-plugin", help="generate a plugin project (package, quantizer, tests, pyproject)")
    p_new.add_argument("name", help="the plugin's name, e.g. 'acme' (distribution quantweave-acme)")
    p_new.add_argument("--dir", help="where to generate it (default: ./quantweave-NAME); must be absent or empty")
    p_new.add_argument("--force", action="store_true", help="generate it even under the name of a first-party plugin")
    args = parser.parse_args(argv)
    if args.command != "new-plugin" and not _environment_understood(manager or default_manager()):
        return 2
    if args.version:
        print(render_version(manager or default_manager()))
        return 0
    if args.command is None:
        parser.error(f"a command is required: {', '.join(sub.choices)} (see quantweave --help)")
    if args.command == "new-plugin":
        return _new_plugin(args.name, args.dir, args.force)
    manager = manager or default_manager()
    if args.command == "compare":
        return _compare(args, manager)
    if args.command == "view":
        return run_view_command(args, manager)
    if args.command == "plugins":
        print(render_plugins(manager, args.json))
        return 0
    if args.plugin is not None and args.plugin not in {r.name for r in manager.plugins()}:
        known = ", ".join(r.name for r in manager.plugins()) or "none"
        print(f"quantweave: no plugin named {args.plugin!r}; installed: {known}", file=sys.stderr)
        return 2
    print(render_capabilities(manager, args.plugin, args.mode, args.json, args.details))
    return 0


def _environment_understood(manager: PluginManager) -> bool:
    """False (with the message on stderr) when a QUANTWEAVE_* variable holds a value not understood."""
    try:
        _ = manager.strict
    except ValueError as exc:
        print(f"quantweave: {exc}", file=sys.stderr)
        return False
    return True


def _new_plugin(name: str, directory: str | None, force: bool = False) -> int:
    from .scaffold import ScaffoldError, new_plugin, plugin_names

    try:
        written = new_plugin(name, directory, force=force)
    except ScaffoldError as exc:
        print(f"quantweave new-plugin: {exc}", file=sys.stderr)
        return 2
    names = plugin_names(name)
    root = written[0].parent
    print(f"created {names.dist} in {root} (package {names.package}, entry point {names.name}):")
    for path in written:
        print(f"  {path.relative_to(root)}")
    print(f"next: cd {root} and run README.md's Develop block (QUANTWEAVE_SOURCE: a checkout of quantweave)")
    return 0


def _compare(args: argparse.Namespace, manager: PluginManager) -> int:
    saved_path = list(sys.path)  # FILE.py's folder goes first on it for the run, as `python FILE.py` does
    try:
        return _run_compare(args, manager)
    except CompareError as exc:
        print(f"quantweave compare: {exc}", file=sys.stderr)
        return 2
    finally:
        sys.path[:] = saved_path


def _run_compare(args: argparse.Namespace, manager: PluginManager) -> int:
    import torch

    from .convert import convert_pt2e
    from .errors import PluginError, UnknownQuantizerError
    from .numerics import compare
    from .prepare import prepare_pt2e
    from .report import annotation_report

    for flag in ("calibration_batches", "compare_batches", "top"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise CompareError(f"--{flag.replace('_', '-')} must be at least 1; got {value}")
    options = _parse_options(args.option)
    factory = _load_factory(args.model)
    model, batches = _call_factory(factory, args.model)
    try:
        quantizer = manager.get_quantizer(args.quantizer, **options)
    except (UnknownQuantizerError, TypeError, PluginError) as exc:
        raise CompareError(f"--quantizer {args.quantizer}: {exc}") from exc
    if not isinstance(model, torch.fx.GraphModule):
        try:
            model = torch.export.export(model.eval(), batches[0]).module()
        except Exception as exc:
            raise CompareError(
                f"MODEL {args.model}: torch.export.export(model, first batch) failed: {type(exc).__name__}: {exc}"
            ) from exc
    calibration = batches[: args.calibration_batches]
    compared = batches[: args.compare_batches]
    step = "prepare_pt2e"
    try:
        prepared = prepare_pt2e(model, quantizer)
        step = "calibration"
        with torch.no_grad():
            for batch in calibration:
                prepared(*batch)
        step = "convert_pt2e"
        converted = convert_pt2e(prepared)
        step = "quantweave.compare"
        numerics = compare(model, converted, compared)
        step = "annotation_report"
        report = annotation_report(prepared, quantizer, numerics=numerics)
    except Exception as exc:
        print(
            f"quantweave compare: {step} of MODEL {args.model} with --quantizer {args.quantizer} failed: "
            f"{type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(
            json.dumps(
                {
                    "model": args.model,
                    "quantizer": args.quantizer,
                    "options": {k: repr(v) for k, v in options.items()},
                    "calibration_batches": len(calibration),
                    "compare": numerics.to_dict(),
                    "annotation_report": report.to_dict(),
                },
                indent=2,
            )
        )
        return 0
    options_text = ", ".join(f"{k}={v!r}" for k, v in options.items())
    print(
        f"{args.model} quantized by {args.quantizer}"
        + (f" ({options_text})" if options_text else "")
        + f", calibrated on {len(calibration)} batch(es); worst first:"
    )
    print(report.to_table(worst_first=True, limit=args.top))
    return 0

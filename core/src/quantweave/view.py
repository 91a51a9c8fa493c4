"""Look, don't read: where quantization hurts, on the graph and in plots.

**Model Explorer overlays** (optional extra ``quantweave[view]``: ``ai-edge-model-explorer``).
:func:`overlays` turns a :func:`quantweave.compare` result (and, optionally, an
:func:`quantweave.annotation_report`) into Model Explorer *node data*, built with Model
Explorer's own classes (``model_explorer.node_data_builder``), keyed to the node ids Model
Explorer's PyTorch adapter gives the float ``ExportedProgram`` (the program whose
``.module()`` was prepared and converted: prepare and convert keep every node's name):

- ``op_sqnr_db`` / ``op_max_abs_error``: the op alone (what the ranking uses);
- ``model_sqnr_db``: the converted model's value at that op, every error before it included;
- ``quantizer``: the quantizer that annotated the node (``float`` for a float node);
- ``float_reason``: why a float node stayed float (its report reason).

An infinite SQNR (exact match) is written as :data:`EXACT_SQNR_DB`, since JSON has no
infinity. :func:`write_overlays` writes them as JSON files for a later Model Explorer
session; :func:`serve` starts Model Explorer's local server on the program with the
overlays (no network; no browser opened unless asked).

**Plots** (optional extra ``quantweave[plots]``: matplotlib; PNG, SVG or PDF by the file's
suffix): :func:`plot_sqnr` (per-op SQNR along the graph), :func:`plot_fallback` (the
fallback's score versus the number of units left float), :func:`plot_observer` (what the
observer of a node recorded during calibration: a histogram, or per-channel / per-tensor
ranges). Each returns a :class:`Plot` whose values are read back from the drawn figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule

from ._modules.view_support import (
    adapter_graph,
    bar_heights,
    import_model_explorer,
    import_pyplot,
    line_points,
    offline_server,
    port_free,
)
from .float_fallback import FallbackResult, fallback
from .numerics import NumericsReport
from .observers import is_observer_module
from .report import AnnotationReport

__all__ = [
    "EXACT_SQNR_DB",
    "OVERLAYS",
    "Plot",
    "overlays",
    "plot_fallback",
    "plot_observer",
    "plot_sqnr",
    "serve",
    "write_overlays",
]

#: the value an infinite SQNR (an exact match) is written as in the overlays
EXACT_SQNR_DB = 200.0
#: overlay key -> its display name in Model Explorer
OVERLAYS = {
    "op_sqnr_db": "quantweave: op SQNR (dB)",
    "op_max_abs_error": "quantweave: op max abs error",
    "model_sqnr_db": "quantweave: model SQNR (dB)",
    "quantizer": "quantweave: quantizer",
    "float_reason": "quantweave: float reason",
}
_SQNR_COLOURS = ((10.0, "#d7301f"), (20.0, "#fc8d59"), (30.0, "#fdcc8a"), (EXACT_SQNR_DB, "#b3e2cd"))
_PALETTE = ("#8dd3c7", "#bebada", "#80b1d3", "#fdb462", "#b3de69", "#fccde5", "#bc80bd", "#ccebc5")
_FLOAT_COLOUR = "#d9d9d9"


def _program(program: Any) -> Any:
    if not isinstance(program, torch.export.ExportedProgram):
        raise TypeError(
            "quantweave.view: program must be the float torch.export.ExportedProgram whose .module() was "
            f"prepared and converted (Model Explorer draws ExportedPrograms); got {type(program).__name__}"
        )
    return program


def _db(value: float) -> float:
    return EXACT_SQNR_DB if math.isinf(value) and value > 0 else float(value)


def _check_ids(where: str, names: Mapping[str, Any], ids: set[str]) -> None:
    missing = [n for n in names if n not in ids]
    if missing:
        raise ValueError(
            f"quantweave.view: {where} node(s) {', '.join(repr(n) for n in missing)} are not nodes of the graph "
            "Model Explorer's PyTorch adapter builds for this program; pass the float ExportedProgram whose "
            ".module() was prepared and converted (node names are kept from it)"
        )


def overlays(program: Any, numerics: NumericsReport, report: AnnotationReport | None = None) -> dict[str, Any]:
    """Model Explorer node data (``model_explorer.node_data_builder.ModelNodeData``), by
    overlay key (:data:`OVERLAYS`), for ``program`` (the float ExportedProgram) from
    ``numerics`` (:func:`quantweave.compare`) and, optionally, ``report``
    (:func:`quantweave.annotation_report`: adds ``quantizer`` and ``float_reason``).

    Raises ``ValueError`` naming any compared or reported node that is not a node of the
    graph Model Explorer builds for ``program``; ``ImportError`` when Model Explorer is
    not installed."""
    me = import_model_explorer()
    ndb = me.node_data_builder
    if not isinstance(numerics, NumericsReport):
        raise TypeError(f"quantweave.view: numerics must be a quantweave.compare result; got {type(numerics).__name__}")
    if report is not None and not isinstance(report, AnnotationReport):
        raise TypeError(
            f"quantweave.view: report must be a quantweave.annotation_report result; got {type(report).__name__}"
        )
    graph_id, ids = adapter_graph(_program(program))
    known = set(ids)
    by_node = numerics.by_node()
    _check_ids("compared", by_node, known)

    def model(key: str, results: dict[str, Any], **style: Any) -> Any:
        data = ndb.GraphNodeData(results=results, name=OVERLAYS[key], **style)
        return ndb.ModelNodeData(graphsData={graph_id: data})

    thresholds = [ndb.ThresholdItem(value=v, bgColor=c) for v, c in _SQNR_COLOURS]
    out = {
        "op_sqnr_db": model(
            "op_sqnr_db",
            {n: ndb.NodeDataResult(value=_db(op.sqnr_db)) for n, op in by_node.items()},
            thresholds=thresholds,
        ),
        "op_max_abs_error": model(
            "op_max_abs_error",
            {n: ndb.NodeDataResult(value=float(op.max_abs_error)) for n, op in by_node.items()},
            gradient=[ndb.GradientItem(stop=0, bgColor="#ffffff"), ndb.GradientItem(stop=1, bgColor="#d7301f")],
        ),
        "model_sqnr_db": model(
            "model_sqnr_db",
            {n: ndb.NodeDataResult(value=_db(op.cumulative_sqnr_db)) for n, op in by_node.items()},
            thresholds=thresholds,
        ),
    }
    if report is not None:
        rows = {row.node: row for row in report.nodes}
        _check_ids("reported", rows, known)
        labels = sorted({row.quantizer or "" for row in report.nodes if row.status == "quantized"})
        colour = {label: _PALETTE[i % len(_PALETTE)] for i, label in enumerate(labels)}
        out["quantizer"] = model(
            "quantizer",
            {
                n: ndb.NodeDataResult(value=row.quantizer or "?", bgColor=colour[row.quantizer or ""])
                if row.status == "quantized"
                else ndb.NodeDataResult(value="float", bgColor=_FLOAT_COLOUR)
                for n, row in rows.items()
            },
            showExpandedSummaryOnGroupNode=True,
        )
        out["float_reason"] = model(
            "float_reason",
            {
                n: ndb.NodeDataResult(value=f"{row.kind}: {row.reason}", bgColor=_FLOAT_COLOUR)
                for n, row in rows.items()
                if row.status == "float"
            },
            showExpandedSummaryOnGroupNode=True,
        )
    return out


def write_overlays(
    program: Any, numerics: NumericsReport, report: AnnotationReport | None, out: str | Path
) -> dict[str, Path]:
    """Write :func:`overlays` as ``<out>/<key>.json`` (Model Explorer's node-data files;
    load them in its UI next to the program saved with ``torch.export.save``). Returns the
    files by overlay key."""
    data = overlays(program, numerics, report)
    directory = Path(out)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"quantweave.view: --out {directory} exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for key, node_data in data.items():
        path = directory / f"{key}.json"
        node_data.save_to_file(str(path))
        files[key] = path
    return files


def serve(
    program: Any,
    numerics: NumericsReport,
    report: AnnotationReport | None = None,
    *,
    name: str = "model",
    host: str = "localhost",
    port: int = 8080,
    open_browser: bool = False,
) -> None:
    """Start Model Explorer's local server on ``program`` with the :func:`overlays`, and
    serve until interrupted (Ctrl+C). Reaches no network (Model Explorer's release check
    is answered locally); opens a browser only when ``open_browser``. Raises ``OSError``
    naming the port when it is taken."""
    data = overlays(program, numerics, report)
    me = import_model_explorer()
    if not port_free(host, port):
        raise OSError(f"quantweave.view: port {port} on {host} is already in use; pass another port")
    config = me.config().add_model_from_pytorch(name, exported_program=program)
    # Model Explorer shows the last one added first: op SQNR
    for key, node_data in reversed(data.items()):
        config.add_node_data(OVERLAYS[key], node_data, model_name=name)
    with offline_server() as server:
        # a port other than 8080 is used as given (8080 lets Model Explorer pick a free one from 8080 up)
        server.start(host=host, port=port, config=config, no_open_in_browser=not open_browser)


# -- plots -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plot:
    """A written figure: ``path``; ``labels`` the x-axis labels (nodes, or bins / channels);
    ``series`` each drawn series' values, read back from the figure."""

    path: Path
    labels: tuple[str, ...]
    series: dict[str, tuple[float, ...]] = field(default_factory=dict)


def _save(plt: Any, fig: Any, path: str | Path) -> Path:
    target = Path(path)
    if target.suffix.lower() not in (".png", ".svg", ".pdf"):
        plt.close(fig)
        raise ValueError(f"quantweave.view: plot file {target} must end in .png, .svg or .pdf")
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(target)
    plt.close(fig)
    return target


def _graph_order(model: Any) -> list[str]:
    if isinstance(model, torch.export.ExportedProgram):
        return [n.name for n in model.graph.nodes]
    if isinstance(model, GraphModule):
        return [n.name for n in model.graph.nodes]
    raise TypeError(
        f"quantweave.view: model must be the float ExportedProgram or GraphModule (for the graph order); "
        f"got {type(model).__name__}"
    )


def plot_sqnr(numerics: NumericsReport, model: Any, path: str | Path) -> Plot:
    """Per-op SQNR along the graph: a bar per compared op in ``model``'s graph order (the
    op alone) and a line for the converted model's SQNR at that op. Exact matches are
    drawn at :data:`EXACT_SQNR_DB`."""
    plt = import_pyplot()
    if not isinstance(numerics, NumericsReport):
        raise TypeError(f"plot_sqnr: numerics must be a quantweave.compare result; got {type(numerics).__name__}")
    order = {name: i for i, name in enumerate(_graph_order(model))}
    by_node = numerics.by_node()
    _check_ids("compared", by_node, set(order))
    nodes = sorted(by_node, key=order.__getitem__)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(nodes) + 2), 4))
    xs = list(range(len(nodes)))
    ax.bar(xs, [_db(by_node[n].sqnr_db) for n in nodes], color="#80b1d3", label="op SQNR (dB)")
    ax.plot(xs, [_db(by_node[n].cumulative_sqnr_db) for n in nodes], "o-", color="#d7301f", label="model SQNR (dB)")
    ax.set_xticks(xs, nodes, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("SQNR (dB), higher is better")
    ax.set_title("quantweave: SQNR per quantized op, in graph order")
    ax.legend()
    series = {
        "op_sqnr_db": tuple(bar_heights(ax)),
        "model_sqnr_db": tuple(y for _, y in line_points(ax, "model SQNR (dB)")),
    }
    return Plot(_save(plt, fig, path), tuple(nodes), series)


def plot_fallback(result: FallbackResult, path: str | Path) -> Plot:
    """The fallback's score versus the number of units left float (0: everything
    quantized), with the float score and the allowed drop."""
    plt = import_pyplot()
    if not isinstance(result, FallbackResult):
        raise TypeError(f"plot_fallback: result must be a quantweave.fallback result; got {type(result).__name__}")
    scores = [result.quantized_score, *(unit.score_with for unit in result.left_float)]
    labels = ["all quantized", *("+ " + ", ".join(unit.nodes) + " float" for unit in result.left_float)]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(scores) + 3), 4))
    xs = list(range(len(scores)))
    ax.plot(xs, scores, "o-", color="#1f78b4", label="score")
    ax.axhline(result.float_score, color="#33a02c", linestyle="--", label=f"float {result.float_score:.4g}")
    ax.axhline(
        result.float_score - result.max_drop, color="#d7301f", linestyle=":", label=f"allowed drop {result.max_drop:g}"
    )
    ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("units left float")
    ax.set_ylabel("score")
    ax.set_title("quantweave fallback: score vs units left float")
    ax.legend()
    series = {"score": tuple(y for _, y in line_points(ax, "score"))}
    return Plot(_save(plt, fig, path), tuple(labels), series)


def _observer_of(model: GraphModule, node: str, input_index: int | None) -> tuple[str, Any]:
    nodes = {n.name: n for n in model.graph.nodes}
    observed = sorted(
        n.args[0].name
        for n in model.graph.nodes
        if n.op == "call_module" and is_observer_module(model.get_submodule(str(n.target))) and n.args
    )
    if node not in nodes:
        raise KeyError(f"plot_observer: no node {node!r} in the prepared model; observed nodes: {', '.join(observed)}")
    target = nodes[node]
    if input_index is not None:
        inputs = target.all_input_nodes
        if not 0 <= input_index < len(inputs):
            raise IndexError(f"plot_observer: node {node!r} has {len(inputs)} input(s); got input {input_index}")
        candidate = inputs[input_index]
        if candidate.op == "call_module" and is_observer_module(model.get_submodule(str(candidate.target))):
            return str(candidate.target), model.get_submodule(str(candidate.target))
        target = candidate
    for user in target.users:
        if user.op == "call_module" and is_observer_module(model.get_submodule(str(user.target))):
            return str(user.target), model.get_submodule(str(user.target))
    raise ValueError(
        f"plot_observer: node {target.name!r} has no observer in the prepared model (pass a prepared, calibrated "
        f"model and an observed node); observed nodes: {', '.join(observed)}"
    )


def plot_observer(model: GraphModule, node: str, path: str | Path, *, input_index: int | None = None) -> Plot:
    """What calibration recorded for ``node`` of a prepared, calibrated ``model``: the
    observer of its output (or, with ``input_index``, of that input: 1 is a conv's or
    linear's weight). A histogram observer is drawn as its histogram over its range; a
    per-channel observer as each channel's [min, max] (an outlier channel stands out); a
    per-tensor one as its [min, max]."""
    plt = import_pyplot()
    if not isinstance(model, GraphModule):
        raise TypeError(f"plot_observer: model must be a prepared GraphModule; got {type(model).__name__}")
    name, observer = _observer_of(model, node, input_index)
    fig, ax = plt.subplots(figsize=(7, 4))
    histogram = getattr(observer, "histogram", None)
    lo = observer.min_val.detach().float()
    hi = observer.max_val.detach().float()
    if lo.numel() == 0 or not torch.isfinite(lo).all() or not torch.isfinite(hi).all():
        plt.close(fig)
        raise ValueError(f"plot_observer: the observer {name} of node {node!r} has seen no data (calibrate first)")
    if isinstance(histogram, torch.Tensor) and histogram.numel() > 1 and lo.numel() == 1:
        counts = histogram.detach().float()
        edges = torch.linspace(float(lo), float(hi), counts.numel() + 1)
        ax.bar(edges[:-1].tolist(), counts.tolist(), width=float(edges[1] - edges[0]), align="edge", color="#80b1d3")
        ax.set_xlabel("value")
        ax.set_ylabel("count (log scale)")
        ax.set_yscale("log")  # an outlier's few values stay visible next to the bulk
        labels = tuple(f"{float(e):.4g}" for e in edges[:-1])
        series = {"count": tuple(bar_heights(ax))}
    else:
        channels = list(range(lo.numel()))
        ax.bar(channels, (hi - lo).flatten().tolist(), bottom=lo.flatten().tolist(), color="#80b1d3")
        ax.set_xlabel("channel" if lo.numel() > 1 else "tensor")
        ax.set_ylabel("observed [min, max]")
        labels = tuple(str(c) for c in channels)
        series = {
            "min": tuple(float(p.get_y()) for p in ax.patches),
            "max": tuple(float(p.get_y() + p.get_height()) for p in ax.patches),
        }
    ax.set_title(f"observer {name} ({type(observer).__name__})\nof node {node!r}", fontsize=10)
    return Plot(_save(plt, fig, path), labels, series)


# -- the `quantweave view` command ------------------------------------------------------------


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, Mapping):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors(item)]
    return []


def _output_mse_score(float_model: Any, batches: list[tuple[Any, ...]]) -> Any:
    """``quantweave view --plot-fallback``'s score (higher is better): minus the mean squared
    error of a model's outputs against ``float_model``'s, averaged over ``batches``."""
    with torch.no_grad():
        reference = [_tensors(float_model(*batch)) for batch in batches]

    def output_mse(model: Any) -> float:
        with torch.no_grad():
            errors = [
                float(torch.mean((got.float() - want.float()) ** 2))
                for batch, wanted in zip(batches, reference, strict=True)
                for got, want in zip(_tensors(model(*batch)), wanted, strict=True)
            ]
        return 0.0 - sum(errors) / max(1, len(errors))  # 0.0, not -0.0, for the float model

    return output_mse


def add_view_command(sub: Any) -> None:
    """Add ``quantweave view`` to the CLI's subcommands."""
    p = sub.add_parser(
        "view",
        help="show where quantization hurts: Model Explorer overlays (served locally or written) and plots",
        description="Quantize MODEL as 'quantweave compare' does, then either start Model Explorer's local server "
        "on the float program with per-node overlays (op / model SQNR, max error, quantizer, float reason; no "
        "network, no browser unless --open-browser), or, with --out, write the overlays (and the program as "
        "model.pt2) for a later Model Explorer session. --plot-sqnr / --plot-observer / --plot-fallback write figures "
        "(PNG, SVG or PDF). Needs quantweave[view] (serving, --out) and quantweave[plots] (figures).",
    )
    p.add_argument("model", metavar="MODEL", help="FILE.py:FUNCTION or MODULE:FUNCTION returning (model, batches)")
    p.add_argument("--quantizer", required=True, help="an installed quantizer (see 'quantweave plugins')")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a quantizer option")
    p.add_argument("--calibration-batches", type=int, help="calibrate on the first N batches (default: all)")
    p.add_argument("--compare-batches", type=int, help="compare on the first N batches (default: all)")
    p.add_argument("--out", metavar="DIR", help="write the overlays and model.pt2 here instead of serving")
    p.add_argument("--plot-sqnr", metavar="FILE", help="write the per-op SQNR plot (graph order)")
    p.add_argument(
        "--plot-observer",
        action="append",
        default=[],
        metavar="NODE[:INPUT]=FILE",
        help="write what the observer of NODE's output (or of its INPUT-th input: 1 = weight) recorded (repeatable)",
    )
    p.add_argument(
        "--plot-fallback",
        metavar="FILE",
        help="run quantweave.fallback (score: minus the mean output MSE against the float model on the compare "
        "batches; needs --max-drop) and write its score versus the number of units left float",
    )
    p.add_argument("--max-drop", type=float, metavar="X", help="--plot-fallback: the allowed drop of the score (>= 0)")
    p.add_argument(
        "--max-units", type=int, default=3, metavar="N", help="--plot-fallback: leave at most N units float (default 3)"
    )
    p.add_argument("--host", default="localhost", help="server host (default localhost)")
    p.add_argument("--port", type=int, default=8080, help="server port (default 8080: the first free from 8080)")
    p.add_argument("--open-browser", action="store_true", help="open the page in a browser once the server runs")


def run_view_command(args: Any, manager: Any) -> int:
    """``quantweave view``; returns the exit status."""
    import sys

    from ._modules import cli_factory
    from .convert import convert_pt2e
    from .errors import PluginError, UnknownQuantizerError
    from .numerics import compare
    from .prepare import prepare_pt2e
    from .report import annotation_report

    def fail(message: str, status: int = 2) -> int:
        print(f"quantweave view: {message}", file=sys.stderr)
        return status

    try:
        observer_plots = []
        for item in args.plot_observer:
            where, sep, file = item.partition("=")
            node, colon, index = where.partition(":")
            if not sep or not node or not file or (colon and not index.isdigit()):
                return fail(f"--plot-observer {item!r}: expected NODE=FILE or NODE:INPUT=FILE")
            observer_plots.append((node, int(index) if colon else None, file))
        if args.plot_fallback and (args.max_drop is None or args.max_drop < 0):
            return fail(f"--plot-fallback needs --max-drop X, the allowed score drop (>= 0); got {args.max_drop}")
        if args.max_drop is not None and not args.plot_fallback:
            return fail("--max-drop is for --plot-fallback FILE, which was not given")
        if args.plot_fallback and args.max_units < 1:
            return fail(f"--max-units must be >= 1; got {args.max_units}")
        options = cli_factory.parse_options(args.option)
        model, batches = cli_factory.call_factory(cli_factory.load_factory(args.model), args.model)
        quantizer = manager.get_quantizer(args.quantizer, **options)
    except cli_factory.CompareError as exc:
        return fail(str(exc))
    except (UnknownQuantizerError, TypeError, PluginError) as exc:
        return fail(f"--quantizer {args.quantizer}: {exc}")
    step = "torch.export.export(model, first batch)"
    try:
        program = torch.export.export(model.eval() if not isinstance(model, GraphModule) else model, batches[0])
        float_model = program.module()
        step = "prepare_pt2e"
        prepared = prepare_pt2e(float_model, quantizer)
        step = "calibration"
        with torch.no_grad():
            for batch in batches[: args.calibration_batches]:
                prepared(*batch)
        step = "convert_pt2e"
        converted = convert_pt2e(prepared)
        step = "quantweave.compare"
        numerics = compare(float_model, converted, batches[: args.compare_batches])
        step = "annotation_report"
        report = annotation_report(prepared, quantizer, numerics=numerics)
        fallback_result = None
        if args.plot_fallback:
            step = "quantweave.fallback"
            fallback_result = fallback(
                float_model,
                manager.get_quantizer(args.quantizer, **options),
                batches[: args.calibration_batches],
                _output_mse_score(float_model, batches[: args.compare_batches]),
                args.max_drop,
                debug_inputs=batches[: args.compare_batches],
                max_units=args.max_units,
            )
            print(fallback_result.summary())
    except Exception as exc:
        return fail(
            f"{step} of MODEL {args.model} with --quantizer {args.quantizer} failed: {type(exc).__name__}: {exc}", 1
        )
    try:
        if args.plot_sqnr:
            print(f"wrote {plot_sqnr(numerics, program, args.plot_sqnr).path}")
        for node, index, file in observer_plots:
            print(f"wrote {plot_observer(prepared, node, file, input_index=index).path}")
        if fallback_result is not None:
            print(f"wrote {plot_fallback(fallback_result, args.plot_fallback).path}")
        if args.out:
            files = write_overlays(program, numerics, report, args.out)
            torch.export.save(program, str(Path(args.out) / "model.pt2"))
            for path in (*files.values(), Path(args.out) / "model.pt2"):
                print(f"wrote {path}")
        elif not (args.plot_sqnr or observer_plots or args.plot_fallback):
            serve(
                program,
                numerics,
                report,
                name=args.model,
                host=args.host,
                port=args.port,
                open_browser=args.open_browser,
            )
    except (ImportError, ValueError, KeyError, IndexError, OSError) as exc:
        return fail(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))
    return 0

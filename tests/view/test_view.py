"""quantweave.view (issue 27): Model Explorer overlays keyed to Model Explorer's own node ids,
its local server serving them, the page drawing them in a headless browser, and plots whose
drawn values are the data's. The model is examples/view_outlier.py's (one layer made to hurt);
the browser is driven by examples/view_screenshot.py's code (which takes docs/view.md's picture)."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import socket
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch

pytestmark = pytest.mark.view
me = pytest.importorskip("model_explorer", reason="needs quantweave[view] (ai-edge-model-explorer)")
pytest.importorskip("matplotlib", reason="needs quantweave[plots] (matplotlib)")
dacite = pytest.importorskip("dacite")

from model_explorer import node_data_builder as ndb  # noqa: E402
from model_explorer.consts import DEFAULT_SETTINGS  # noqa: E402
from model_explorer.pytorch_exported_program_adapter_impl import PytorchExportedProgramAdapterImpl  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's dependency)

import quantweave as qw  # noqa: E402
from quantweave import view  # noqa: E402
from quantweave.cli import main  # noqa: E402
from quantweave.numerics import NumericsReport, OpNumerics  # noqa: E402
from quantweave.registry import PluginManager  # noqa: E402
from quantweave_x86 import plugin as x86_plugin  # noqa: E402
from quantweave_x86.quantizer import X86InductorQuantizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUTLIER = ROOT / "examples" / "view_outlier.py"
HURT_LAYER = "fc2"  # examples/view_outlier.py: its input's channel 0 is the outlier
HURT_NODE = "linear_1"  # fc2's linear


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"_view_example_{name}", ROOT / "examples" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


outlier = _example("view_outlier")
browser_driver = _example("view_screenshot")


@pytest.fixture(scope="module")
def flow():
    model, batches = outlier.build()
    program = torch.export.export(model, batches[0])
    float_model = program.module()
    quantizer = X86InductorQuantizer()
    prepared = qw.prepare_pt2e(float_model, quantizer)
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
    converted = qw.convert_pt2e(prepared)
    numerics = qw.compare(float_model, converted, batches)
    report = qw.annotation_report(prepared, quantizer, numerics=numerics)
    return program, float_model, batches, prepared, numerics, report


@pytest.fixture(scope="module")
def served():
    """`quantweave view examples/view_outlier.py:build --quantizer x86` on a free local port: the page's URL."""
    with browser_driver.serving() as url:
        yield url


def _adapter_graph(program, ordered: bool = False):
    """The graph Model Explorer's own adapter builds (not quantweave's helper): its id and node ids."""
    (graph,) = PytorchExportedProgramAdapterImpl(program, DEFAULT_SETTINGS).convert()["graphs"]
    ids = [node.id for node in graph.nodes]
    return graph.id, (ids if ordered else set(ids))


def _load(path: Path, labels: bool = False) -> dict[str, ndb.GraphNodeData]:
    """A node-data file read back into Model Explorer's own dataclasses. ``labels``: the
    values are strings (quantizer, float reason), which Model Explorer's UI shows as labels
    (see ``showExpandedSummaryOnGroupNode``) though ``NodeDataResult.value`` is annotated as
    a number, so types are not checked for them (they are asserted to be str instead)."""
    raw = json.loads(path.read_text())
    config = dacite.Config(check_types=not labels)
    loaded = {graph: dacite.from_dict(ndb.GraphNodeData, data, config=config) for graph, data in raw.items()}
    for data in loaded.values():
        assert all(isinstance(r, ndb.NodeDataResult) for r in data.results.values())
        assert all(isinstance(r.value, str if labels else (int, float)) for r in data.results.values())
    return loaded


def test_every_overlay_id_is_a_node_of_the_graph_model_explorer_builds(flow):
    program, _, _, _, numerics, report = flow
    graph_id, ids = _adapter_graph(program)
    data = view.overlays(program, numerics, report)
    assert set(data) == set(view.OVERLAYS)
    for key, model_data in data.items():
        assert isinstance(model_data, ndb.ModelNodeData)
        assert set(model_data.graphsData) == {graph_id}, key
        results = model_data.graphsData[graph_id].results
        assert set(results) <= ids, (key, set(results) - ids)
    assert set(data["op_sqnr_db"].graphsData[graph_id].results) == {op.node for op in numerics.ops}
    assert set(data["quantizer"].graphsData[graph_id].results) == {row.node for row in report.nodes}


def test_written_overlays_load_through_model_explorers_classes_with_the_compare_values(flow, tmp_path):
    program, _, _, _, numerics, report = flow
    files = view.write_overlays(program, numerics, report, tmp_path / "ov")
    assert set(files) == set(view.OVERLAYS)
    graph_id, _ = _adapter_graph(program)
    sqnr = _load(files["op_sqnr_db"])[graph_id]
    assert sqnr.name == view.OVERLAYS["op_sqnr_db"]
    err = _load(files["op_max_abs_error"])[graph_id]
    model_sqnr = _load(files["model_sqnr_db"])[graph_id]
    for op in numerics.ops:
        expected = view.EXACT_SQNR_DB if math.isinf(op.sqnr_db) else op.sqnr_db
        assert sqnr.results[op.node].value == pytest.approx(expected)
        assert err.results[op.node].value == pytest.approx(op.max_abs_error)
        assert model_sqnr.results[op.node].value == pytest.approx(op.cumulative_sqnr_db)
    quantizer = _load(files["quantizer"], labels=True)[graph_id]
    for row in report.nodes:
        assert quantizer.results[row.node].value == (row.quantizer if row.status == "quantized" else "float")
    reasons = _load(files["float_reason"], labels=True)[graph_id]
    assert set(reasons.results) == {row.node for row in report.nodes if row.status == "float"}


def test_the_layer_made_to_hurt_is_worst_and_red_in_the_overlay(flow):
    program, _, _, _, numerics, report = flow
    graph_id, _ = _adapter_graph(program)
    results = view.overlays(program, numerics, report)["op_sqnr_db"].graphsData[graph_id]
    worst = min(results.results, key=lambda n: results.results[n].value)
    assert worst == HURT_NODE
    assert numerics.by_node()[worst].module == HURT_LAYER
    # the thresholds colour it as the lowest band (<= 20 dB) and no other node
    low = [n for n, r in results.results.items() if r.value <= results.thresholds[1].value]
    assert low == [HURT_NODE]


def test_a_compared_node_missing_from_the_program_is_named(flow):
    program, _, _, _, numerics, _ = flow
    ghost = OpNumerics("ghost_conv", "aten.conv2d.default", "", "ghost_conv", 1, False, 10.0, 0.1, 10.0, 0.1)
    bad = NumericsReport((*numerics.ops, ghost), batches=1)
    with pytest.raises(ValueError, match="ghost_conv"):
        view.overlays(program, bad)
    with pytest.raises(TypeError, match="ExportedProgram"):
        view.overlays(program.module(), numerics)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read()


def test_the_local_server_serves_the_graph_and_the_overlays(served):
    base = served.split("/?", 1)[0]
    assert _get(f"{base}/check_health") == b"model_explorer_ok"
    assert b"<html" in _get(f"{base}/").lower()  # the web app, from the installed package
    graphs = json.loads(_get(f"{base}/api/v1/load_graphs_json?graph_index=0"))
    ids = {node["id"] for node in graphs["graphs"][0]["nodes"]}
    assert HURT_NODE in ids
    names = []
    for index in range(len(view.OVERLAYS)):
        content = json.loads(json.loads(_get(f"{base}/api/v1/load_node_data?node_data_index={index}"))["content"])
        ((graph_id, data),) = content.items()
        assert graph_id == graphs["graphs"][0]["id"]
        assert set(data["results"]) <= ids
        names.append(data["name"])
    assert names == list(reversed(view.OVERLAYS.values()))  # op SQNR last: the one Model Explorer shows


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


@pytest.fixture(scope="module")
def browser_binary():
    binary = browser_driver.find_browser()
    if binary is None:
        pytest.skip(f"no headless browser: none of {', '.join(browser_driver.BROWSERS)} is on PATH")
    return binary


def test_the_page_draws_the_graph_and_the_overlays_in_a_headless_browser(browser_binary, served, flow):
    """The page in headless Chromium (no network: every request off the machine fails at once):
    the graph is laid out with the adapter's nodes; the Node data table shows each compared
    op's SQNR with its band colour, the hurt layer's alone in the low bands; the canvas, layers
    expanded, is drawn (not blank) with the hurt node's band colour on it."""
    program, _, _, _, numerics, _ = flow
    graph_id, ids = _adapter_graph(program, ordered=True)
    sqnr = view.overlays(program, numerics)["op_sqnr_db"].graphsData[graph_id]
    band = {n: next(t.bgColor for t in sqnr.thresholds if r.value <= t.value) for n, r in sqnr.results.items()}
    low = {t.bgColor for t in sqnr.thresholds[:2]}  # <= 20 dB: red and orange
    browser = browser_driver.Chromium(browser_binary)
    try:
        state = browser_driver.wait_for_graph(browser, served, list(view.OVERLAYS.values()))
        assert state["nodes"] == str(len(ids))
        column = 2 + state["headers"].index(view.OVERLAYS["op_sqnr_db"])
        quantizer = 2 + state["headers"].index(view.OVERLAYS["quantizer"])
        rows = {ids[int(row[0][0])]: row for row in state["rows"]}
        assert set(rows) == set(ids)
        shown = {node: row[column] for node, row in rows.items() if row[column][0] != "-"}
        assert set(shown) == set(sqnr.results)
        for node, (value, colour) in shown.items():
            assert float(value) == pytest.approx(sqnr.results[node].value), node
            assert colour == "rgb({}, {}, {})".format(*_rgb(band[node])), node
        assert [n for n in shown if band[n] in low] == [HURT_NODE]
        assert rows[HURT_NODE][quantizer][0] == "x86"

        browser_driver.expand_all(browser)
        deadline = time.monotonic() + 60
        hurt_colour = _rgb(band[HURT_NODE])
        while True:  # the layers open (animated): the hurt node's op is drawn in its band's colour
            picture = Image.open(io.BytesIO(browser.screenshot(clip=state["canvas"]))).convert("RGB")
            colours = dict((c, n) for n, c in picture.getcolors(maxcolors=1 << 24))
            if colours.get(hurt_colour, 0) > 500 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert colours.get(hurt_colour, 0) > 500, sorted(colours.items(), key=lambda kv: -kv[1])[:10]
        assert len(colours) > 50  # not blank: boxes, text, edges
        assert not any(colours.get(_rgb(c), 0) for c in low - {band[HURT_NODE]})  # no other low band drawn
        requests = browser.requests()
        local = "http://127.0.0.1:"
        assert any(url.startswith(local) and status == "ok" for url, status in requests.items())
        off_machine = {
            url: status
            for url, status in requests.items()
            if urlsplit(url).scheme in ("http", "https", "ws", "wss")
            and urlsplit(url).hostname not in ("127.0.0.1", "localhost")
        }
        assert all(status.startswith("failed") for status in off_machine.values()), off_machine
        assert any((urlsplit(url).hostname or "").startswith("fonts.") for url in off_machine)  # Google fonts
    finally:
        browser.close()


def test_serve_names_a_taken_port(flow):
    program, _, _, _, numerics, _ = flow
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=str(port)):
            view.serve(program, numerics, host="127.0.0.1", port=port)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_sqnr_plot_draws_the_compare_values_in_graph_order(flow, tmp_path, suffix):
    program, _, _, _, numerics, _ = flow
    plot = view.plot_sqnr(numerics, program, tmp_path / f"sqnr{suffix}")
    assert plot.path.stat().st_size > 1000
    head = plot.path.read_bytes()[:200]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in plot.path.read_bytes()
    order = [n.name for n in program.graph.nodes]
    assert list(plot.labels) == sorted((op.node for op in numerics.ops), key=order.index)
    by_node = numerics.by_node()
    assert plot.series["op_sqnr_db"] == pytest.approx([by_node[n].sqnr_db for n in plot.labels])
    assert plot.series["model_sqnr_db"] == pytest.approx([by_node[n].cumulative_sqnr_db for n in plot.labels])
    assert min(zip(plot.series["op_sqnr_db"], plot.labels, strict=True))[1] == HURT_NODE


def test_observer_plots_draw_what_calibration_recorded(flow, tmp_path):
    _, float_model, _, prepared, _, _ = flow
    # fc2's weight, per channel: each bar spans the row's [min, max]
    plot = view.plot_observer(prepared, HURT_NODE, tmp_path / "w.png", input_index=1)
    weight = float_model.get_parameter("fc2.weight").detach()
    lo, hi = torch.aminmax(weight, dim=1)
    assert plot.series["min"] == pytest.approx(lo.tolist(), abs=1e-6)
    assert plot.series["max"] == pytest.approx(hi.tolist(), abs=1e-6)
    # the activation fc2 reads (relu_1, the outlier channel's): its histogram observer's counts
    plot = view.plot_observer(prepared, "relu_1", tmp_path / "a.svg")
    observer = next(
        prepared.get_submodule(str(n.target))
        for n in prepared.graph.nodes
        if n.op == "call_module" and n.args and getattr(n.args[0], "name", None) == "relu_1"
    )
    assert plot.series["count"] == pytest.approx(observer.histogram.tolist())
    assert float(plot.labels[0]) == pytest.approx(float(observer.min_val), rel=1e-3, abs=1e-3)
    assert plot.path.stat().st_size > 1000
    with pytest.raises(ValueError, match="conv2d"):  # fused with its relu: its output is not observed
        view.plot_observer(prepared, "conv2d", tmp_path / "x.png")
    with pytest.raises(KeyError, match="nope"):
        view.plot_observer(prepared, "nope", tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"x\.gif"):
        view.plot_observer(prepared, "relu_1", tmp_path / "x.gif")


def test_fallback_plot_draws_the_score_per_unit_left_float(flow, tmp_path):
    _, float_model, batches, _, _, _ = flow
    reference = [float_model(*b) for b in batches]

    def evaluate(model) -> float:
        with torch.no_grad():
            return -sum(float(torch.mean((model(*b) - r) ** 2)) for b, r in zip(batches, reference, strict=True))

    result = qw.fallback(float_model, X86InductorQuantizer(), batches, evaluate, max_drop=1e-4, max_units=2)
    plot = view.plot_fallback(result, tmp_path / "fallback.png")
    assert plot.series["score"] == pytest.approx([result.quantized_score, *(u.score_with for u in result.left_float)])
    assert len(plot.labels) == 1 + len(result.left_float)
    assert plot.path.stat().st_size > 1000


def test_cli_writes_overlays_program_and_plots(tmp_path, capsys):
    manager = PluginManager(entry_points=[])
    manager.register("x86", x86_plugin)
    out = tmp_path / "out"
    code = main(
        [
            "view",
            f"{OUTLIER}:build",
            "--quantizer",
            "x86",
            "--out",
            str(out),
            "--plot-sqnr",
            str(tmp_path / "sqnr.svg"),
            "--plot-observer",
            f"{HURT_NODE}:1={tmp_path / 'w.png'}",
            "--plot-fallback",
            str(tmp_path / "fallback.svg"),
            "--max-drop",
            "1e-5",
            "--max-units",
            "2",
        ],
        manager=manager,
    )
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert {p.name for p in out.iterdir()} == {f"{k}.json" for k in view.OVERLAYS} | {"model.pt2"}
    program = torch.export.load(str(out / "model.pt2"))
    graph_id, ids = _adapter_graph(program)
    sqnr = _load(out / "op_sqnr_db.json")[graph_id]
    assert set(sqnr.results) <= ids
    assert min(sqnr.results, key=lambda n: sqnr.results[n].value) == HURT_NODE
    assert (tmp_path / "sqnr.svg").stat().st_size > 1000 and (tmp_path / "w.png").stat().st_size > 1000
    # the fallback leaves the hurt layer float first; its plot draws one point per unit after "all quantized"
    floated = [line.split("float:", 1)[1] for line in stdout.splitlines() if line.strip().startswith("float:")]
    assert floated and HURT_NODE in floated[0].split(" -- ")[0].replace(",", " ").split(), stdout
    figure = (tmp_path / "fallback.svg").read_text()
    assert f"wrote {tmp_path / 'fallback.svg'}" in stdout
    assert "all quantized" in figure and HURT_NODE in figure


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--plot-observer", "relu_1"], "--plot-observer"),
        (["--plot-fallback", "f.png"], "--max-drop"),
        (["--plot-fallback", "f.png", "--max-drop", "0", "--max-units", "0"], "--max-units"),
        (["--max-drop", "0.1"], "--plot-fallback"),
    ],
)
def test_cli_names_a_bad_plot_argument(capsys, extra, named):
    manager = PluginManager(entry_points=[])
    manager.register("x86", x86_plugin)
    code = main(["view", f"{OUTLIER}:build", "--quantizer", "x86", *extra], manager=manager)
    assert code == 2
    assert named in capsys.readouterr().err


def test_cli_serve_names_a_taken_port(capsys):
    manager = PluginManager(entry_points=[])
    manager.register("x86", x86_plugin)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code = main(
            ["view", f"{OUTLIER}:build", "--quantizer", "x86", "--host", "127.0.0.1", "--port", str(port)],
            manager=manager,
        )
    assert code == 2
    assert f"port {port}" in capsys.readouterr().err

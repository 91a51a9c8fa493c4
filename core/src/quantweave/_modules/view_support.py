"""Private helpers of :mod:`quantweave.view`: importing the optional extras with a clear
error, Model Explorer's node ids for an ExportedProgram, a local Model Explorer server that
reaches no network, and reading back what a matplotlib figure drew."""

from __future__ import annotations

import contextlib
import importlib
import socket
from collections.abc import Iterator
from typing import Any

VIEW_EXTRA = "pip install 'quantweave[view]'  (ai-edge-model-explorer)"
PLOTS_EXTRA = "pip install 'quantweave[plots]'  (matplotlib)"


def import_model_explorer() -> Any:
    """``model_explorer``, or an ImportError naming the extra to install."""
    try:
        return importlib.import_module("model_explorer")
    except ImportError as exc:
        raise ImportError(
            f"quantweave.view needs Model Explorer, which is not installed ({exc}); {VIEW_EXTRA}"
        ) from exc


def import_pyplot() -> Any:
    """matplotlib's pyplot on the non-interactive Agg backend, or an ImportError naming the extra."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError as exc:
        raise ImportError(f"quantweave's plots need matplotlib, which is not installed ({exc}); {PLOTS_EXTRA}") from exc
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def adapter_graph(program: Any, settings: dict[str, Any] | None = None) -> tuple[str, list[str]]:
    """The graph id and node ids Model Explorer's own PyTorch adapter gives ``program``
    (what the overlays must be keyed to)."""
    import_model_explorer()
    impl = importlib.import_module("model_explorer.pytorch_exported_program_adapter_impl")
    consts = importlib.import_module("model_explorer.consts")
    graphs = impl.PytorchExportedProgramAdapterImpl(program, settings or consts.DEFAULT_SETTINGS).convert()
    graph = graphs["graphs"][0]
    return graph.id, [node.id for node in graph.nodes]


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex((host, port)) != 0


@contextlib.contextmanager
def offline_server() -> Iterator[Any]:
    """Model Explorer's ``server`` module with its release check (a request to pypi.org and
    GitHub after start, and from the page) replaced by a local answer for as long as the
    server runs: quantweave's view reaches no network."""
    server: Any = importlib.import_module("model_explorer.server")
    original = server._check_new_version

    def no_check(print_msg: bool = True) -> dict[str, str]:
        return {"version": "", "runningVersion": "", "releaseUrl": "", "desktopAppUrl": ""}

    server._check_new_version = no_check
    try:
        yield server
    finally:
        server._check_new_version = original


def bar_heights(axes: Any) -> list[float]:
    """The heights of the bars drawn on ``axes`` (read back from the figure)."""
    return [float(p.get_height()) for p in axes.patches]


def line_points(axes: Any, label: str) -> list[tuple[float, float]]:
    """The (x, y) points of the line labelled ``label`` on ``axes``."""
    for line in axes.get_lines():
        if line.get_label() == label:
            return [(float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)]
    raise KeyError(label)

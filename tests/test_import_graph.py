"""The core has no import cycles, the plugin contract stays a leaf, and no module of the repository
imports a test module: shared test helpers live in helper modules (tests/helpers.py and its topical
neighbours), never in a ``test_*.py`` another module imports (static check, no torch needed: runs in
the tox `lint` env as well as with the suite).

Every import counts, wherever it stands: at module level and inside functions and methods
(an import deferred into a function is a cycle all the same, only hidden until the call);
only ``if TYPE_CHECKING:`` blocks, which never run, are skipped."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "core" / "src"
PACKAGE = "quantweave"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.Module):
    """Imports executed when the module is imported: top level and plain ``if``/``try``
    blocks, not function bodies and not ``if TYPE_CHECKING:``."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]


def _all_imports(tree: ast.Module):
    """Every import the module can execute: at any depth (functions, methods, nested
    blocks), except inside ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            stack += node.orelse
        else:
            stack += ast.iter_child_nodes(node)


def import_graph(function_level: bool = True) -> dict[str, set[str]]:
    """module -> the core modules it imports (``function_level=False``: only those imported
    when it is imported)."""
    read = _all_imports if function_level else _module_level_imports
    modules = {_module_name(p): p for p in (SRC / PACKAGE).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in read(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import sub` imports the submodule when `sub` is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_core():
    graph = import_graph()
    assert "quantweave.registry" in graph["quantweave.cli"]
    assert "quantweave.plugin_api" in graph["quantweave.hookspecs"]


def test_core_modules_import_no_cycle():
    assert _cycles(import_graph()) == []


def test_function_level_imports_are_read():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from a import skipped\n"
        "import top\n"
        "def f():\n    from .inner import x\n    class C:\n        def m(self):\n            import deep\n"
    )
    found = {getattr(n, "module", None) or n.names[0].name for n in _all_imports(ast.parse(source))}
    assert found == {"typing", "top", "inner", "deep"}
    graph = import_graph()
    # imported only inside functions: seen by the full graph, not by the module-level one
    assert "quantweave._modules.derive" in graph["quantweave.capabilities"]
    assert "quantweave._modules.derive" not in import_graph(function_level=False)["quantweave.capabilities"]


def test_nothing_outside_testing_imports_testing():
    graph = import_graph()
    reaching = sorted(
        name
        for name, targets in graph.items()
        if not name.startswith(f"{PACKAGE}.testing") and any(t.startswith(f"{PACKAGE}.testing") for t in targets)
    )
    assert reaching == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("leaf", ["quantweave.plugin_api"])
def test_the_plugin_contract_never_reaches_the_loader(leaf):
    graph = import_graph()
    reached, todo = set(), [leaf]
    while todo:
        for nxt in graph[todo.pop()] - reached:
            reached.add(nxt)
            todo.append(nxt)
    assert not reached & {"quantweave.registry", "quantweave.hookspecs", "quantweave.cli"}, sorted(reached)


# -- no module imports a test module


SKIPPED_DIRS = {"build", "dist", "__pycache__", "node_modules", "venv", "site-packages"}


def _skipped_dir(name: str) -> bool:
    return name.startswith(".") or name in SKIPPED_DIRS or name.endswith(".egg-info")


def _python_files(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*.py") if not any(_skipped_dir(part) for part in p.relative_to(root).parts[:-1])
    )


def _is_test_module(path: Path) -> bool:
    """What pytest collects as a test module (its default ``python_files``: test_*.py, *_test.py)."""
    return path.name.startswith("test_") or path.stem.endswith("_test")


def _import_name(path: Path) -> str:
    """The name pytest imports ``path`` under (its default "prepend" mode): the file's name dotted
    onto each enclosing directory that holds an ``__init__.py``."""
    parts = [] if path.name == "__init__.py" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def _imported_names(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> list[str]:
    """Every module name an import statement may import (for ``from a import b``: ``a`` and ``a.b``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = importer.split(".") if is_package else importer.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" if base else alias.name for alias in node.names]


def imports_of_test_modules(root: Path) -> list[str]:
    """'importer imports module (line n)' for each import, anywhere under ``root`` and at any depth
    (functions included), of a test module other than the importer itself."""
    files = _python_files(root)
    tests = {_import_name(p): p for p in files if _is_test_module(p)}
    found = []
    for path in files:
        importer = _import_name(path)
        for node in _all_imports(ast.parse(path.read_text(), str(path))):
            for name in _imported_names(node, importer, path.name == "__init__.py"):
                if name in tests and tests[name] != path:
                    where = path.relative_to(root).as_posix()
                    found.append(f"{where} imports {name} (line {node.lineno})")
    return sorted(set(found))


def test_no_module_imports_a_test_module():
    found = imports_of_test_modules(ROOT)
    assert found == [], "move what they share into tests/helpers.py (or a topical helper module beside it)"


def test_an_import_of_a_test_module_is_found_naming_importer_and_imported(tmp_path):
    files = {
        "tests/__init__.py": "",
        "tests/helpers.py": "def shared(): ...\n",
        "tests/core/__init__.py": "",
        "tests/core/test_a.py": "from tests.helpers import shared\nfrom tests.core.test_a import shared\n",
        "tests/core/test_b.py": "def f():\n    from tests.core.test_a import shared\n",
        "tests/core/test_c.py": "from . import test_a\nfrom .test_b import f\n",
        "tests/other/__init__.py": "",
        "tests/other/test_d.py": "import tests.core.test_c\nfrom ..core import helpers_like\n",
        "tests/other/helper.py": "from tests.core.test_b import f\n",
        "tests/other/_lazy_test.py": "",
        "tests/other/test_e.py": "from tests.other import _lazy_test\n",
        "contrib/x/tests/test_f.py": "from test_g import g\n",
        "contrib/x/tests/test_g.py": "def g(): ...\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert imports_of_test_modules(tmp_path) == [
        "contrib/x/tests/test_f.py imports test_g (line 1)",
        "tests/core/test_b.py imports tests.core.test_a (line 2)",
        "tests/core/test_c.py imports tests.core.test_a (line 1)",
        "tests/core/test_c.py imports tests.core.test_b (line 2)",
        "tests/other/helper.py imports tests.core.test_b (line 1)",
        "tests/other/test_d.py imports tests.core.test_c (line 1)",
        "tests/other/test_e.py imports tests.other._lazy_test (line 1)",
    ]

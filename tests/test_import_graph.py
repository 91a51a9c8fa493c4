"""The core has no import cycles, and the plugin contract stays a leaf (static check, no torch
needed: runs in the tox `lint` env as well as with the suite).

Every import counts, wherever it stands: at module level and inside functions and methods
(an import deferred into a function is a cycle all the same, only hidden until the call);
only ``if TYPE_CHECKING:`` blocks, which never run, are skipped."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "core" / "src"
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

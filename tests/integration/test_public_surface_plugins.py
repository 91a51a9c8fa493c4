"""Every first-party and contrib plugin is written against the new homes of the names that left
``quantweave``'s top level (plugin_api / authoring / testing), never a deprecated alias, exactly as
a third-party plugin should be (read from the sources: an alias used inside a function only warns
when it runs)."""

import ast
from pathlib import Path

import pytest

from quantweave._modules.surface import MOVED

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for p in [*ROOT.glob("plugins/*/src"), *ROOT.glob("contrib/*/src")] if p.is_dir())


def deprecated_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases = {"quantweave"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == "quantweave"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if node.attr in MOVED:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "quantweave":
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: from quantweave import {a.name}"
                for a in node.names
                if a.name in MOVED
            ]
    return found


def test_the_sources_are_found():
    assert {p.parent.name for p in SOURCES} >= {
        "x86",
        "xnnpack",
        "embedding",
        "executorch",
        "vendors",
        "onnxruntime",
        "litert",
        "template",
    }


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.parent.name)
def test_a_plugin_uses_no_deprecated_quantweave_name(src):
    found = [use for path in sorted(src.rglob("*.py")) for use in deprecated_uses(path)]
    assert not found, "deprecated quantweave names (use quantweave.plugin_api / quantweave.authoring):\n" + "\n".join(
        found
    )

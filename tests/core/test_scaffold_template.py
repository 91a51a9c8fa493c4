"""contrib/template is what ``quantweave new-plugin template`` generates, modulo the name.

The test generates the project into a temporary directory and compares it, file by file,
with contrib/template after two substitutions: the name (``quantweave-template`` ->
``quantweave-contrib-template``, ``quantweave_template`` -> ``quantweave_contrib_template``)
and what a generated project leaves to its author and the template states
(:data:`AUTHOR_CHOICES`: the license, the authors, the version; LICENSE is the
repository's). After changing the scaffold (core/src/quantweave/_scaffold), regenerate:
``python tests/core/test_scaffold_template.py --write``.
"""

from __future__ import annotations

import difflib
import sys
import tempfile
from pathlib import Path

from quantweave.scaffold import new_plugin

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "contrib" / "template"
RENAMES = (
    ("quantweave-template", "quantweave-contrib-template"),
    ("quantweave_template", "quantweave_contrib_template"),
)
#: file -> (line the scaffold generates, line contrib/template has instead)
AUTHOR_CHOICES: dict[str, tuple[tuple[str, str], ...]] = {
    "pyproject.toml": (
        ('# license = "BSD-3-Clause"', 'license = "BSD-3-Clause"'),
        ('authors = [{ name = "template authors" }]', 'authors = [{ name = "quantweave contributors" }]'),
    ),
    "src/quantweave_contrib_template/__init__.py": (('__version__ = "0.1.0"', '__version__ = "0.1.1"'),),
}
_IGNORED = ("__pycache__", ".egg-info", ".tox", ".venv", "build", "dist", ".pytest_cache", ".ruff_cache")


def _rename(text: str) -> str:
    for old, new in RENAMES:
        text = text.replace(old, new)
    return text


def expected_files() -> dict[str, str]:
    """contrib/template's files as the scaffold generates them: path -> text (LICENSE: the repository's)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "template"
        new_plugin("template", root)
        files = {_rename(p.relative_to(root).as_posix()): p.read_text(encoding="utf-8") for p in _files(root)}
    out = {}
    for path, text in files.items():
        text = _rename(text)
        for generated, chosen in AUTHOR_CHOICES.get(path, ()):
            lines = text.split("\n")
            assert lines.count(generated) == 1, f"the scaffold's {path} no longer has the line {generated!r}"
            text = "\n".join(chosen if line == generated else line for line in lines)
        out[path] = text
    out["LICENSE"] = (ROOT / "LICENSE").read_text(encoding="utf-8")
    return out


def _files(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.endswith(_IGNORED) for part in p.parts[len(root.parts) :])
    )


def test_contrib_template_is_the_scaffold_output_for_template():
    expected = expected_files()
    actual = {p.relative_to(TEMPLATE).as_posix(): p.read_text(encoding="utf-8") for p in _files(TEMPLATE)}
    assert sorted(actual) == sorted(expected), "contrib/template and the scaffold's output differ in their files"
    for path, text in expected.items():
        diff = "\n".join(
            difflib.unified_diff(
                text.splitlines(),
                actual[path].splitlines(),
                f"scaffold/{path}",
                f"contrib/template/{path}",
                lineterm="",
            )
        )
        assert not diff, (
            f"contrib/template/{path} differs from the scaffold's output (regenerate: python {Path(__file__).name} "
            f"--write):\n{diff}"
        )


def test_the_author_choices_are_the_only_substitutions():
    """Nothing but the name and the listed author choices is changed: undoing them gives back the scaffold's text."""
    with tempfile.TemporaryDirectory() as tmp:
        new_plugin("template", Path(tmp) / "t")
        generated = (Path(tmp) / "t" / "pyproject.toml").read_text(encoding="utf-8")
    text = (TEMPLATE / "pyproject.toml").read_text(encoding="utf-8")
    for generated_line, chosen in AUTHOR_CHOICES["pyproject.toml"]:
        text = text.replace(chosen, generated_line)
    for old, new in RENAMES:
        text = text.replace(new, old)
    assert text == generated


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/core/test_scaffold_template.py --write  (regenerates contrib/template)")
    for path in _files(TEMPLATE):
        path.unlink()
    for relative, content in expected_files().items():
        target = TEMPLATE / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        print("wrote", target.relative_to(ROOT))

"""Every fenced ```python / ```bash block of README.md, docs/*.md and each plugin's README runs
as written (issue #26), so a snippet that stops running fails CI.

- Python blocks run in a subprocess, from a fresh temporary directory: one subprocess for
  all the blocks of a runtime (torch is imported once), each block in a fresh namespace
  (``__name__ == "__main__"``); tests/_snippet_worker.py runs them and reports each block.
- Shell blocks are checked for form and run only where that is safe: ``quantweave ...``
  commands run (``[optional]`` parts dropped; all of a run in one subprocess), ``pip install``
  lines are checked (torch pinned, local paths exist), ``python FILE --opt``, ``pytest PATH``,
  ``torchrun FILE`` and ``tox -e ENV`` must name files, options and envs that exist.
- An HTML comment on the line(s) just above a block says how to run it:
  ``<!-- snippet: executorch -->`` (or ``litert``, ``onnxruntime``, ``peer``, ``hosting``,
  ``accuracy``: the block runs in that tox env, under that marker), ``<!-- snippet: continues -->``
  (the block runs in the namespace of the block before it in the same document, as a reader
  reads it), ``<!-- snippet: skip, REASON -->`` (never run; the reason is shown).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import assert_names

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "_snippet_worker.py"
RUNTIMES = ("executorch", "litert", "onnxruntime", "peer", "hosting", "accuracy")
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell")
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
DIRECTIVE = re.compile(r"<!--\s*snippet:\s*(.*?)\s*-->")


def documents() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found += sorted((ROOT / "plugins").glob("*/README.md")) + sorted((ROOT / "contrib").glob("*/README.md"))
    return [p for p in found if p.is_file()]


@dataclass
class Block:
    doc: str  # path relative to the repository root
    line: int  # line of the opening fence
    language: str  # "python" or "shell"
    code: str
    runtime: str | None = None
    continues: bool = False
    skip: str | None = None
    directives: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _directives(text: str, start: int) -> list[str]:
    """The ``<!-- snippet: ... -->`` comments on the non-blank lines just above offset ``start``."""
    found: list[str] = []
    for line in reversed(text[:start].splitlines()[-3:]):
        match = DIRECTIVE.search(line)
        if match:
            found.append(match.group(1))
        elif line.strip():
            break
    return found


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text()
    result = []
    for match in FENCE.finditer(text):
        language = match.group(1).lower()
        if language not in PYTHON + SHELL:
            continue
        block = Block(
            doc=str(path.relative_to(ROOT)),
            line=text.count("\n", 0, match.start()) + 1,
            language="python" if language in PYTHON else "shell",
            code=match.group(2),
        )
        for directive in _directives(text, match.start()):
            block.directives.append(directive)
            head, _, rest = directive.partition(",")
            for word in [head.strip(), *([] if head.strip() == "skip" else [w.strip() for w in rest.split(",")])]:
                if word == "skip":
                    block.skip = rest.strip() or "no reason given"
                elif word == "continues":
                    block.continues = True
                elif word in RUNTIMES:
                    block.runtime = word
                elif word:
                    raise ValueError(f"{block.id}: unknown snippet directive {word!r} in <!-- snippet: {directive} -->")
        result.append(block)
    return result


ALL = [block for doc in documents() for block in blocks_of(doc)]


def _param(block: Block):
    marks = [getattr(pytest.mark, block.runtime)] if block.runtime else []
    return pytest.param(block, id=block.id, marks=marks)


# -- python blocks ----------------------------------------------------------------------------


class _Job:
    """A subprocess started from a fresh temporary directory, ``data`` on its standard input;
    :meth:`result` waits for it and returns the last line of its output, as JSON."""

    def __init__(self, argv: list[str], data: object) -> None:
        self.where = tempfile.mkdtemp(prefix="quantweave-snippets-")
        env = {**os.environ}  # what is installed (and PYTHONPATH), not the repository's folders
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.where,
            env=env,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(data))
        self.proc.stdin.close()
        self.proc.stdin = None  # written and closed: communicate() only reads
        self.value: object = None

    def result(self) -> object:
        if self.value is None:
            try:
                out, err = self.proc.communicate(timeout=900)
            finally:
                shutil.rmtree(self.where, ignore_errors=True)
            try:
                self.value = json.loads(out.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                self.value = RuntimeError(f"exit {self.proc.returncode}:\n{out}\n{err}")
        return self.value


_JOBS: dict[str | None, dict[str, _Job]] = {}


def _jobs(runtime: str | None) -> dict[str, _Job]:
    """The python blocks and the ``quantweave`` command lines of ``runtime`` (None: none), each
    group in one subprocess, both started at once (they run side by side)."""
    if runtime not in _JOBS:
        group = [
            {"id": b.id, "code": b.code, "continues": b.continues}
            for b in ALL
            if b.language == "python" and b.runtime == runtime and b.skip is None
        ]
        _JOBS[runtime] = {
            "python": _Job([sys.executable, str(WORKER)], group),
            "cli": _Job([sys.executable, "-c", CLI_RUNNER], _cli_lines(runtime)),
        }
    return _JOBS[runtime]


@pytest.mark.parametrize("block", [_param(b) for b in ALL if b.language == "python"])
def test_python_snippet_runs(block: Block):
    if block.skip is not None:
        pytest.skip(f"{block.id}: {block.skip}")
    results = _jobs(block.runtime)["python"].result()
    assert not isinstance(results, Exception), f"the snippet worker failed: {results}"
    result = results.get(block.id)  # type: ignore[union-attr]
    assert result is not None, f"{block.id} was not run"
    print(f"{block.id}: {result.get('seconds')} s")  # shown with -s / -rA
    assert "error" not in result, f"the python block at {block.id} failed:\n{result['error']}"


# -- shell blocks -----------------------------------------------------------------------------


def commands_of(code: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments dropped, ``&&`` split."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        commands += [part.strip() for part in line.split("&&") if part.strip()]
    return commands


def _words(command: str) -> list[str]:
    return shlex.split(re.sub(r"\[[^\]]*\]", "", command) if command.split()[0].endswith("quantweave") else command)


def check_pip(words: list[str], where: str) -> None:
    for word in words[words.index("install") + 1 :]:
        if word.startswith("-"):
            continue
        name = word.split("[", 1)[0]
        if re.fullmatch(r"torch([<>=!~].*)?", name):
            assert name == "torch==2.13.0", f"{where}: unpinned torch {word!r} (an unpinned torch is the CUDA build)"
        if name.startswith(("./", "../", "/")):
            assert (ROOT / name).is_dir(), f"{where}: {word!r} is no folder of the repository"


def check_script(words: list[str], where: str) -> None:
    """``python FILE --opt`` / ``torchrun ... FILE --opt``: FILE exists and defines each option."""
    scripts = [w for w in words if w.endswith(".py")]
    assert scripts, f"{where}: no script named"
    script = ROOT / scripts[0]
    assert script.is_file(), f"{where}: {scripts[0]} does not exist"
    source = script.read_text()
    after = words[words.index(scripts[0]) + 1 :]
    for option in (w.split("=", 1)[0] for w in after if w.startswith("--")):
        assert f'"{option}"' in source or f"'{option}'" in source, f"{where}: {scripts[0]} has no option {option}"


def check_command(command: str, where: str, cli: list[list[str]]) -> None:
    words = _words(command)
    words = [w for w in words if not re.fullmatch(r"[A-Z_]+=\S*", w)]  # leading VAR=value
    program = Path(words[0]).name
    if program in ("pip", "pip3") or words[1:3] == ["-m", "pip"]:
        check_pip(words, where)
    elif program == "quantweave":
        cli.append(words[1:])
    elif program in ("python", "python3") and words[1:3] == ["-m", "venv"]:
        pass
    elif program in ("python", "python3") and words[1:2] == ["-m"]:
        assert words[2] in ("build", "pytest", "quantweave"), f"{where}: unexpected module {words[2]!r}"
    elif program in ("python", "python3", "torchrun"):
        check_script(words, where)
    elif program == "pytest":
        for path in (w for w in words[1:] if not w.startswith("-") and "/" in w):
            assert (ROOT / path).exists(), f"{where}: {path} does not exist"
        if "-m" in words:
            marker = words[words.index("-m") + 1]
            assert f'"{marker}:' in (ROOT / "pyproject.toml").read_text(), f"{where}: unknown marker {marker}"
    elif program == "tox":
        if "-e" in words:
            env = words[words.index("-e") + 1]
            # a project's README (contrib/template) means the project's own tox.ini
            doc = ROOT / where.split(":", 1)[0]
            tox_ini = doc.parent / "tox.ini" if (doc.parent / "tox.ini").is_file() else ROOT / "tox.ini"
            text = tox_ini.read_text()
            envlist = re.search(r"^envlist\s*=\s*(.*)$", text, re.M)
            known = (
                f"[testenv:{env}]" in text
                or (envlist is not None and env in re.split(r"[\s,]+", envlist.group(1)))
                or re.search(rf"^\s+{re.escape(env)}:", text, re.M) is not None  # a factor of the base env
            )
            assert known, f"{where}: {tox_ini.relative_to(ROOT)} has no env {env}"
    elif program == "export":
        assert all(re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w) for w in words[1:]), f"{where}: expected export VAR=value"
    elif program == "grep":
        pass  # reads a file (the CPU's flags); nothing to check
    elif program == "twine":
        assert words[1] in ("check", "upload"), f"{where}: unexpected twine command"
    else:
        raise AssertionError(f"{where}: the snippet runner does not know how to check {command!r}")


#: runs ``quantweave`` command lines (a JSON list of argv on standard input), each once, and
#: prints their exit status, time and output as one JSON line
CLI_RUNNER = """
import contextlib, io, json, sys, time
from quantweave.cli import main
out = {}
for argv in json.loads(sys.stdin.read()):
    if ' '.join(argv) in out:
        continue
    buffer, start = io.StringIO(), time.perf_counter()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        status = main(argv)
    seconds = time.perf_counter() - start
    out[' '.join(argv)] = f'exit {status}: ({seconds:.1f} s) ' + buffer.getvalue()[-2000:]
print(json.dumps(out))
"""


def _cli_lines(runtime: str | None) -> list[list[str]]:
    lines: list[list[str]] = []
    for block in ALL:
        if block.language == "shell" and block.runtime == runtime and block.skip is None:
            for command in commands_of(block.code):
                words = _words(command)
                if Path(words[0]).name == "quantweave":
                    lines.append(words[1:])
    return lines


@pytest.mark.parametrize("block", [_param(b) for b in ALL if b.language == "shell"])
def test_shell_snippet_is_well_formed_and_its_commands_run(block: Block):
    if block.skip is not None:
        pytest.skip(f"{block.id}: {block.skip}")
    cli: list[list[str]] = []
    for command in commands_of(block.code):
        check_command(command, f"{block.id} `{command}`", cli)
    results = _jobs(block.runtime)["cli"].result() if cli else {}
    assert not isinstance(results, Exception), f"the quantweave commands failed: {results}"
    for argv in cli:
        output = results[" ".join(argv)]  # type: ignore[index]
        assert output.startswith("exit 0:"), f"{block.id}: `quantweave {' '.join(argv)}` failed: {output}"
        print(f"{block.id}: quantweave {' '.join(argv)}: {output[8:22]}")  # its time, shown with -s


# -- the runner itself ------------------------------------------------------------------------


def test_the_runner_finds_the_documents_and_reads_directives(tmp_path):
    assert len({b.doc for b in ALL}) >= 10 and sum(b.language == "python" for b in ALL) >= 20
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- snippet: executorch, continues -->\n```python\nx = 1\n```\n\n"
        "<!-- snippet: skip, needs a GPU -->\n```bash\nnvidia-smi\n```\n\n```toml\n[x]\n```\n"
    )
    first, second = blocks_of_at(page, tmp_path)
    assert (first.runtime, first.continues, first.skip, first.line) == ("executorch", True, None, 4)
    assert (second.language, second.skip) == ("shell", "needs a GPU")
    page.write_text("<!-- snippet: typo -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="typo"):
        blocks_of_at(page, tmp_path)


def blocks_of_at(path: Path, root: Path) -> list[Block]:
    global ROOT
    saved, ROOT = ROOT, root
    try:
        return blocks_of(path)
    finally:
        ROOT = saved


def test_a_failing_block_is_reported_with_its_place(tmp_path):
    group = [
        {"id": "doc.md:1", "code": "x = 1\n", "continues": False},
        {"id": "doc.md:5", "code": "assert x == 1\n", "continues": True},
        {"id": "doc.md:9", "code": "x\n", "continues": False},  # a fresh namespace: no x
    ]
    proc = subprocess.run(
        [sys.executable, str(WORKER)], input=json.dumps(group), capture_output=True, text=True, cwd=tmp_path
    )
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in results["doc.md:1"] and "error" not in results["doc.md:5"]
    assert "NameError" in results["doc.md:9"]["error"] and "doc.md:9" in results["doc.md:9"]["error"]


def test_shell_checks_catch_an_unpinned_torch_and_a_missing_path():
    with pytest.raises(AssertionError) as info:
        check_command("pip install torch numpy", "here", [])
    assert_names(info, "here:", "unpinned", "'torch'")
    with pytest.raises(AssertionError) as info:
        check_command("pip install torch==2.13.0 ./plugins/nope", "here", [])
    assert_names(info, "here:", "'./plugins/nope'", "no folder")
    with pytest.raises(AssertionError) as info:
        check_command("python examples/quickstart.py --nope", "here", [])
    assert_names(info, "here:", "examples/quickstart.py", "no option", "--nope")

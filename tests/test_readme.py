"""The README's set-up commands are the ones the project really runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_readme_opens_with_two_setup_commands_and_ci_runs_the_second():
    commands = setup_commands()
    assert len(commands) == 2
    assert "pip install torch==2.13.0" in commands[0] and "examples/quickstart.py" in commands[0]
    assert commands[1] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_every_torch_install_is_pinned():
    # an unpinned torch resolves to a multi-GB CUDA build
    install_lines = [line for line in (ROOT / "README.md").read_text().splitlines() if "pip install" in line]
    install_lines += [
        line.strip()
        for line in (ROOT / "tox.ini").read_text().splitlines()
        if not line.strip().startswith(("#", "description"))
    ]
    for line in install_lines:
        for token in re.findall(r"(?<![\w./-])torch(?![\w./-])\S*", line):
            assert token == "torch==2.13.0", f"unpinned torch in {line!r}"


def test_the_install_line_brings_numpy_so_torch_does_not_warn_at_import():
    assert " numpy " in setup_commands()[0]


def test_using_it_starts_from_a_real_quantizer_and_shows_where_lowering_begins():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Using it", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.+?)\n```", section, flags=re.S)[0]
    lines = code.splitlines()
    first = next(i for i, line in enumerate(lines) if "qw." in line)
    assert 'qw.get_quantizer("x86")' in lines[first]  # a real, installed quantizer, not `my_quantizer`
    for call in (
        "qw.prepare_pt2e(",
        "qw.calibrate(",
        "qw.convert_pt2e(",
        "qw.save(",
        "qw.load(",
        "quantweave_x86.lower(",
    ):
        assert call in code, call
    reference_end = next(i for i, line in enumerate(lines) if "backend-neutral reference" in line)
    lowering = next(i for i, line in enumerate(lines) if "backend lowering starts here" in line)
    assert reference_end < lowering < next(i for i, line in enumerate(lines) if "quantweave_x86.lower(" in line)

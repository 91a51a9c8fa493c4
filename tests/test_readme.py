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

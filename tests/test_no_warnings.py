"""Normal use raises no warning of ours (issue #26): the CLI under ``-W error``, and the
README's flow (export, prepare, calibrate, convert, save / load, x86 lower) with every warning
recorded. "Ours": a quantweave warning class, a warning raised from quantweave's code or the
examples, or one a dependency raises because of what we give it (inductor's
``mkldnn_lowerings`` copy-construct warning, caused by int64 weight zero points)."""

import importlib.util
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import quantweave as qw

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("quantweave", "quantweave_x86", "quantweave_xnnpack", "quantweave_embedding", "quantweave_executorch")


def _folders() -> tuple[str, ...]:
    found = [str(ROOT / "examples")]
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            found.append(str(Path(spec.origin).resolve().parent))
    return tuple(found)


def ours(record: warnings.WarningMessage) -> bool:
    if issubclass(record.category, (qw.MisuseWarning, qw.PluginWarning)):
        return True
    return str(Path(record.filename).resolve()).startswith(_folders()) or "mkldnn_lowerings" in record.filename


CLI_COMMANDS = (("--version",), ("plugins",), ("capabilities", "--plugin", "x86"))
#: one interpreter runs every command (torch imported once, not once per command): ``-m quantweave``'s
#: ``main``, its exit status and a marker line on stderr before each command, so each test reads its own part
_CLI_RUNNER = """
import json, sys, traceback
from quantweave.cli import main
codes = []
for argv in json.loads(sys.argv[1]):
    sys.stdout.flush()
    print("@@ command", len(codes), file=sys.stderr, flush=True)
    try:
        codes.append(main(argv))
    except SystemExit as exit:
        codes.append(exit.code)
    except Exception:  # a warning made an error by -W error: this command fails, the next ones still run
        traceback.print_exc()
        codes.append("raised")
    sys.stdout.flush()
    sys.stderr.flush()
print("@@ codes", json.dumps(codes), file=sys.stderr, flush=True)
"""


@pytest.fixture(scope="module")
def cli_under_w_error(tmp_path_factory) -> tuple[list, list[str]]:
    """Every command of :data:`CLI_COMMANDS` under ``-W error`` in one interpreter: (exit statuses, the
    stderr of each command: what came before its marker, the imports, is in the first)."""
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", _CLI_RUNNER, json.dumps(CLI_COMMANDS)],
        capture_output=True,
        text=True,
        cwd=tmp_path_factory.mktemp("cli"),
        timeout=300,
    )
    parts = re.split(r"^@@ command \d+\n", proc.stderr, flags=re.M)
    parts = [parts[0] + parts[1], *parts[2:]] if len(parts) > 1 else parts
    codes_line = re.search(r"^@@ codes (.*)$", parts[-1], re.M)
    assert proc.returncode == 0 and codes_line is not None, proc.stderr
    parts[-1] = parts[-1][: codes_line.start()]
    codes = json.loads(codes_line[1])
    assert len(codes) == len(parts) == len(CLI_COMMANDS), proc.stderr
    return codes, parts


@pytest.mark.parametrize("command", range(len(CLI_COMMANDS)), ids=[c[0].lstrip("-") for c in CLI_COMMANDS])
def test_the_cli_runs_under_w_error(command, cli_under_w_error):
    codes, stderr = cli_under_w_error
    assert codes[command] == 0, (CLI_COMMANDS[command], stderr[command])
    assert "Warning" not in stderr[command], (CLI_COMMANDS[command], stderr[command])


def test_the_readme_flow_with_x86_lowering_warns_nothing_of_ours(tmp_path):
    quantweave_x86 = pytest.importorskip("quantweave_x86")
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4)
    ).eval()
    args = (torch.randn(1, 3, 8, 8),)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantizer = qw.get_quantizer("x86", reduce_range=quantweave_x86.cpu_needs_reduce_range())
        prepared = qw.prepare_pt2e(torch.export.export(model, args).module(), quantizer)
        qw.calibrate(prepared, [args, (torch.randn(1, 3, 8, 8),)])
        converted = qw.convert_pt2e(prepared)
        qw.save(converted, args, tmp_path / "model.pt2")
        loaded = qw.load(tmp_path / "model.pt2")
        lowered = quantweave_x86.lower(loaded, args)
        lowered(*args)
    mine = [f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}" for w in caught if ours(w)]
    assert not mine, "\n".join(mine)


def _import_executorch(tmp_path, prelude: str = "") -> subprocess.CompletedProcess:
    code = (
        f"{prelude}\n"
        "from quantweave_xnnpack import import_executorch\n"
        "import_executorch('executorch.exir')\n"
        "print('imported')\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)


@pytest.mark.executorch
def test_importing_executorch_for_lowering_prints_no_torchao_library_lines(tmp_path):
    pytest.importorskip("quantweave_xnnpack")
    proc = _import_executorch(tmp_path)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr
    assert "Failed to load" not in proc.stderr and "KernelPreference" not in proc.stderr, proc.stderr


@pytest.mark.executorch
def test_without_numpy_the_error_names_numpy_not_executorch(tmp_path):
    pytest.importorskip("quantweave_xnnpack")
    proc = _import_executorch(tmp_path, "import sys; sys.modules['numpy'] = None  # as if numpy were not installed")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("quantweave_xnnpack.import_executorch") or "ExecuTorchNotInstalledError" in last, last
    assert "'numpy'" in last and "pip install numpy" in last and "ExecuTorch is installed" in last, last
    assert "needs ExecuTorch 1.5.1" not in last


@pytest.mark.executorch
def test_lowering_to_executorch_and_running_prints_no_warning_or_cpuinfo_line(tmp_path):
    pytest.importorskip("quantweave_xnnpack")
    code = (
        "import torch, quantweave as qw, quantweave_xnnpack as qx\n"
        "model, args = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), (torch.randn(2, 8),)\n"
        "quantizer = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config())\n"
        "prepared = qw.prepare_pt2e(torch.export.export(model, args).module(), quantizer)\n"
        "qw.calibrate(prepared, [args])\n"
        "program = qx.to_executorch(qw.convert_pt2e(prepared), args)\n"
        "print(program.load()(*args)[0].shape)\n"
    )
    # Python's default warning filters: what a user's script shows (-W always would add the
    # dependencies' own DeprecationWarnings, which a user does not see either)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr
    noise = [
        line
        for line in proc.stderr.splitlines()
        if "cpuinfo" in line or "Failed to load" in line or ("Warning" in line and "LeafSpec" not in line)
    ]
    assert not noise, proc.stderr  # LeafSpec: a deepcopy of a graph, left to the x86 / xnnpack restructuring

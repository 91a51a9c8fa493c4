"""The README's first command runs examples/quickstart.py: CI runs it too, on the tiny setting."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def load_quickstart():
    spec = importlib.util.spec_from_file_location("quickstart", QUICKSTART)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # the whole example in a subprocess (tox env slow)
def test_the_quickstart_runs_end_to_end_on_the_tiny_setting(tmp_path):
    pytest.importorskip("quantweave_x86")
    start = time.perf_counter()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(QUICKSTART), "--tiny", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line[:16].strip(): line[17:] for line in proc.stdout.splitlines() if line[:16].strip()}
    assert lines["model"].startswith("tiny ResNet-like, input 1x3x32x32, 2 calibration batches")
    assert lines["quantizer"].startswith("X86InductorQuantizer(name='x86'")
    assert lines["calibration"].startswith("2 batches, ") and "observers saw data" in lines["calibration"]
    assert lines["save/load"] == "identical outputs"
    assert lines["saved size"].endswith(f"-> {tmp_path / 'out'}")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["resnet18_like_fp32.pt2", "resnet18_like_int8.pt2"]
    assert "x faster; median of 3 runs" in lines["latency (b1)"]
    assert lines["CPU int8"]  # the int8 instructions found, and on the next line what they mean
    assert any(word in proc.stdout for word in ("AMX:", "VNNI:", "AVX2 without VNNI", "no x86 int8 instructions"))
    print(f"quickstart --tiny: {elapsed:.1f} s")  # measured: ~40 s on 2 loaded cores (inductor compiles twice)


def test_without_out_nothing_is_left_on_disk():
    quickstart = load_quickstart()
    with quickstart.output_dir(None) as where:
        (where / "file").write_text("x")
    assert not where.exists()


def test_int8_speed_notes_follow_the_cpu_flags():
    note = load_quickstart().int8_speed_note
    assert note({"amx_int8", "avx512_vnni", "avx2"}) == (
        "amx_int8, avx512_vnni, avx2",
        "AMX: int8 matrix tiles; int8 conv/linear can be several times faster than fp32",
    )
    assert note({"avx_vnni", "avx2"})[1].startswith("VNNI: one instruction per int8 multiply-accumulate")
    assert note({"avx2", "fma"})[1].startswith("AVX2 without VNNI: int8 dot products take several instructions")
    assert note(set())[0].startswith("none of amx_int8")

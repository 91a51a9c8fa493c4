"""Memory and time of PT2E quantization at LLM size (issue 25): quantweave vs torchao/ExecuTorch.

Models: ``quantweave.testing.models.tiny_decoder_lm`` scaled up (vocab 32000, dim 1024, 16
heads, 32 positions, untied head) with 2 / 9 / 23 decoder layers: 90.7M / 178.8M / 355.0M
parameters, i.e. 0.36 / 0.72 / 1.42 GB of fp32 weights (``--sizes 0.35,0.7,1.4``), each in
fp32 and in bf16 (built in fp32, then ``.to(torch.bfloat16)``, before the baseline is read).

Flows (``--flows``), each run in a fresh process per (size, dtype, flow):

- ``qw-xnnpack``: quantweave-xnnpack, ``get_symmetric_quantization_config(is_per_channel=True,
  is_dynamic=True)``; save = ``quantweave.save``;
- ``qw-llm``: quantweave-executorch's ``ExecuTorchQuantizer("llm")`` (8-bit tables, dynamic
  per-token int8 linears); save = ``quantweave.save``;
- ``ao-xnnpack``: ExecuTorch 1.5.1's ``XNNPACKQuantizer`` with the same dynamic per-channel
  config, torchao 0.18's ``prepare_pt2e`` / ``convert_pt2e``; save = ``torch.export.save`` of
  ``torch.export.export(converted)``;
- ``ao-llm``: ExecuTorch's own LLM composition (``get_pt2e_quantizers`` of
  ``--pt2e_quantize embedding,xnnpack_dynamic``) with torchao's prepare / convert; save as above.

Phases: export (``torch.export.export(model).module()``), prepare, calibrate (2 prompts of
16 tokens), convert, save (to a temporary directory, removed afterwards). Each phase is
measured on its own: before it the kernel's RSS high-water mark is reset (``5`` written to
``/proc/self/clear_refs``) and after it ``VmHWM`` is read from ``/proc/self/status``. Reported
per phase: wall time, the peak RSS **above the loaded float model** (VmHWM minus the RSS
read after the model was built and ran one forward, as a multiple of the model's *fp32* weight bytes, for bf16
models too), and the growth within the phase (VmHWM minus the RSS just before the phase).
Earlier phases' results stay alive (as in a script that quantizes then saves), so a later
phase's peak includes them. The float model's one forward before the baseline pays torch's
own first-forward costs (kernels' code paged in, the matmul library's buffers: ~18 MB at
every size, paid by any use of the model, quantized or not); its growth is printed and kept
(``first_forward_bytes``), and ``--cold`` measures without it (the definition before session 5,
where that cost fell in calibrate). The load average is printed with every row: figures from a
loaded machine are not speed claims and must be re-measured on a quiet one.

    python benchmarks/bench_llm_memory.py [--sizes 0.35,0.7,1.4] [--dtypes fp32,bf16]
        [--flows qw-xnnpack,qw-llm,ao-xnnpack,ao-llm] [--threads N] [--cold] [--json PATH]

Needs torchao 0.18 and ExecuTorch 1.5.1 (``--no-deps``) for the ``ao-*`` flows only.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

LAYERS = {"0.35": 2, "0.7": 9, "1.4": 23}
DIM, VOCAB, HEADS, SEQ = 1024, 32000, 16, 32
PHASES = ("export", "prepare", "calibrate", "convert", "save")


def _status(key: str) -> int:
    """A ``/proc/self/status`` field in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def worker(size: str, dtype_name: str, flow: str, threads: int, warm: bool = True) -> dict[str, Any]:
    """One (size, dtype, flow) in this process: the phases' time and peak RSS."""
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    from quantweave.testing.models import lm_prompts, tiny_decoder_lm

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    model = tiny_decoder_lm(vocab=VOCAB, dim=DIM, layers=LAYERS[size], heads=HEADS, max_seq=SEQ).to(dtype)
    prompts = lm_prompts(model, 2, seq=16)
    example = (prompts[:1],)
    params = sum(p.numel() for p in model.parameters())
    fp32_bytes = 4 * params

    if flow.startswith("qw-"):
        import quantweave as qw

        if flow == "qw-xnnpack":
            from quantweave_xnnpack import XNNPACKQuantizer, get_symmetric_quantization_config

            quantizer: Any = XNNPACKQuantizer().set_global(
                get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
            )
        else:
            from quantweave_executorch import ExecuTorchQuantizer

            quantizer = ExecuTorchQuantizer("llm")
        prepare, convert = qw.prepare_pt2e, qw.convert_pt2e

        def save(converted: Any, path: Path) -> None:
            qw.save(converted, example, path)

    else:
        from torchao.quantization.pt2e import quantize_pt2e as ao

        if flow == "ao-xnnpack":
            from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
                XNNPACKQuantizer as EtXNNPACKQuantizer,
            )
            from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
                get_symmetric_quantization_config as et_config,
            )

            quantizer = EtXNNPACKQuantizer().set_global(et_config(is_per_channel=True, is_dynamic=True))
        else:
            from executorch.extension.llm.export import quantizer_lib as lib
            from torchao.quantization.pt2e.quantizer import ComposableQuantizer

            options = lib.get_pt2e_quantization_params("embedding,xnnpack_dynamic", None)
            quantizer = ComposableQuantizer(lib.get_pt2e_quantizers(options))
        prepare, convert = ao.prepare_pt2e, ao.convert_pt2e

        def save(converted: Any, path: Path) -> None:
            torch.export.save(torch.export.export(converted, example), path)

    # torch.export's own modules (dynamo, sympy, ...) are imported by a first export of
    # anything: done here on a tiny module so that their ~0.1 GB is not counted as the flow's
    torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),)).module()
    gc.collect()
    cold = _status("VmRSS")
    # torch's own first-forward costs (its kernels' code paged in, the matmul library's
    # buffers: ~18 MB, the same for every size) are paid by the float model's first forward,
    # whether or not it is then quantized: one forward of the float model here, its growth
    # reported (``first_forward_bytes``; add it to peak>float for the figure without it)
    if warm:
        with torch.no_grad():
            model(prompts[:1])
        gc.collect()
    baseline = _status("VmRSS")
    state: dict[str, Any] = {}
    tmp = tempfile.TemporaryDirectory(prefix="bench_llm_memory_")

    def run_phase(phase: str) -> None:
        if phase == "export":
            state["exported"] = torch.export.export(model, example).module()
        elif phase == "prepare":
            state["prepared"] = prepare(state["exported"], quantizer)
        elif phase == "calibrate":
            with torch.no_grad():
                for i in range(prompts.shape[0]):
                    state["prepared"](prompts[i : i + 1])
        elif phase == "convert":
            state["converted"] = convert(state["prepared"])
        else:
            path = Path(tmp.name) / "model.pt2"
            save(state["converted"], path)
            state["file_bytes"] = path.stat().st_size
            path.unlink()

    rows: dict[str, Any] = {}
    for phase in PHASES:
        gc.collect()
        before = _status("VmRSS")
        _reset_hwm()
        start = time.perf_counter()
        run_phase(phase)
        seconds = time.perf_counter() - start
        hwm = _status("VmHWM")
        rows[phase] = {
            "seconds": seconds,
            "peak_above_float": (hwm - baseline) / fp32_bytes,
            "growth_in_phase": (hwm - before) / fp32_bytes,
            "load": os.getloadavg()[0],
        }
    tmp.cleanup()
    return {
        "size": size,
        "dtype": dtype_name,
        "flow": flow,
        "parameters": params,
        "fp32_gb": fp32_bytes / 1e9,
        "baseline_rss_gb": baseline / 1e9,
        "first_forward_bytes": baseline - cold,
        "file_bytes": state.get("file_bytes"),
        "phases": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.35,0.7,1.4")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--flows", default="qw-xnnpack,qw-llm,ao-xnnpack,ao-llm")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--cold", action="store_true", help="no float forward before the baseline (torch's first-forward cost counted)"
    )
    parser.add_argument("--worker", nargs=3, metavar=("SIZE", "DTYPE", "FLOW"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.threads, warm=not args.cold)))
        return
    results = []
    print(f"load average at start {os.getloadavg()}; peak and growth are multiples of the fp32 weight bytes")
    print(
        f"{'GB':>5} {'dtype':>5} {'flow':<11} {'phase':<9} {'s':>7} {'s/GB':>6} {'peak>float':>10} "
        f"{'growth':>7} {'load1':>5}"
    )
    for size in args.sizes.split(","):
        for dtype_name in args.dtypes.split(","):
            for flow in args.flows.split(","):
                command = [sys.executable, __file__, "--worker", size, dtype_name, flow, "--threads", str(args.threads)]
                command += ["--cold"] if args.cold else []
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    print(f"{size:>5} {dtype_name:>5} {flow:<11} FAILED: {done.stderr.strip().splitlines()[-1:]}")
                    continue
                result = json.loads(done.stdout.strip().splitlines()[-1])
                results.append(result)
                first = result["first_forward_bytes"] / (result["fp32_gb"] * 1e9)
                print(
                    f"{result['fp32_gb']:>5.2f} {dtype_name:>5} {flow:<11} first float forward (before the baseline) "
                    f"+{first:.3f}x"
                )
                for phase, row in result["phases"].items():
                    print(
                        f"{result['fp32_gb']:>5.2f} {dtype_name:>5} {flow:<11} {phase:<9} {row['seconds']:>7.2f} "
                        f"{row['seconds'] / result['fp32_gb']:>6.2f} {row['peak_above_float']:>9.3f}x "
                        f"{row['growth_in_phase']:>6.3f}x {row['load']:>5.2f}",
                        flush=True,
                    )
    print(f"load average at end {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

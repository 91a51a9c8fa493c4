"""A decoder LM on the ExecuTorch runtime: fp32 vs quantweave-executorch's "llm" recipe.

Needs ExecuTorch 1.5.1 (installed as in plugins/executorch/README.md: ``--no-deps``). The
model is ``quantweave.testing.models.tiny_decoder_lm()`` (vocab 32000, dim 128, 2 layers,
4 heads, 64 learned positions, untied head: 8,596,992 parameters). It has no KV cache, so
there is no decode step to time: the latency measured is the full forward of a 64-token
window (the prefill; decoding without a cache would repeat it per token).

Programs, each lowered with ``quantweave_executorch.to_executorch`` (tables ->
``embedding_byte`` / ``embedding_4bit``, linears -> XNNPACK), loaded on the runtime, warmed
up, then timed in interleaved rounds (median call reported):

- ``fp32``: the float model (XNNPACK fp32 delegates);
- ``llm-8bit``: 8-bit tables + dynamic int8 per-channel linears;
- ``llm-4bit-g32`` / ``llm-4bit-g128``: 4-bit tables (groups of 32 / 128) + int8 linears;
- ``llm-4bit-lin4``: 4-bit tables (groups of 32) + 4-bit per-channel linears;
- ``llm-4bit-g32-f16`` / ``llm-4bit-g128-f16``: as ``-g32`` / ``-g128`` with float16 table
  scales (``embedding_scale_dtype=torch.float16``);
- ``llm-8bit-per-tensor``: ``llm-8bit`` with ExecuTorch's per-tensor dynamic activations
  (``act_granularity="per_tensor"``; the recipe's default is per token).

Linear activations are quantized per token (the recipe's default) except in
``llm-8bit-per-tensor``.

Also printed: .pte size and ratio to fp32, logits SQNR vs the float model and top-1 token
agreement on 8 fixed prompts (runtime outputs), and the load average before and after.

    python benchmarks/bench_executorch_llm.py [--quick] [--iters N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from typing import Any

import torch

warnings.filterwarnings("ignore")

RECIPES: dict[str, dict[str, Any]] = {
    "llm-8bit": {},
    "llm-4bit-g32": {"embedding_bits": 4, "embedding_group_size": 32},
    "llm-4bit-g128": {"embedding_bits": 4, "embedding_group_size": 128},
    "llm-4bit-lin4": {"embedding_bits": 4, "embedding_group_size": 32, "linear_bits": 4},
    "llm-4bit-g32-f16": {"embedding_bits": 4, "embedding_group_size": 32, "embedding_scale_dtype": torch.float16},
    "llm-4bit-g128-f16": {"embedding_bits": 4, "embedding_group_size": 128, "embedding_scale_dtype": torch.float16},
    "llm-8bit-per-tensor": {"act_granularity": "per_tensor"},
}


def latency(runners: dict[str, Any], inputs: tuple[torch.Tensor, ...], iters: int, rounds: int = 5) -> dict:
    """Median seconds per forward call of each loaded program, timed in interleaved rounds."""
    for runner in runners.values():
        for _ in range(max(3, iters // 10)):
            runner(*inputs)
    times: dict[str, list[float]] = {name: [] for name in runners}
    per_round = max(1, iters // rounds)
    names = list(runners)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for _ in range(per_round):
                start = time.perf_counter()
                runners[name](*inputs)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="vocab 4096 (a smoke run, not the recorded figures)")
    parser.add_argument("--iters", type=int, default=100, help="timed runtime calls per program")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    import quantweave as qw
    import quantweave_executorch as qe
    from quantweave.testing.inspect import sqnr
    from quantweave.testing.models import lm_prompts, tiny_decoder_lm

    torch.set_num_threads(2)
    load_before = os.getloadavg()
    model = tiny_decoder_lm(vocab=4096 if args.quick else 32000)
    prompts = lm_prompts(model, 8)
    window = (prompts[:1],)
    with torch.no_grad():
        reference = torch.cat([model(prompts[i : i + 1]) for i in range(8)])
    programs: dict[str, Any] = {"fp32": qe.to_executorch(model, window)}
    for name, options in RECIPES.items():
        quantizer = qe.ExecuTorchQuantizer("llm", **options)
        prepared = qw.prepare_pt2e(torch.export.export(model, window).module(), quantizer)
        for i in range(4):
            prepared(prompts[i : i + 1])
        programs[name] = qe.to_executorch(qw.convert_pt2e(prepared), window)
    runners = {name: program.load() for name, program in programs.items()}
    outputs = {name: torch.cat([runner(prompts[i : i + 1])[0] for i in range(8)]) for name, runner in runners.items()}
    lat = latency(runners, window, args.iters)
    load_after = os.getloadavg()

    params = sum(p.numel() for p in model.parameters())
    print(
        f"tiny_decoder_lm: vocab {model.tok.num_embeddings}, dim {model.tok.embedding_dim}, "
        f"{len(model.blocks)} layers, {params:,} parameters; forward of a {window[0].shape[1]}-token window, "
        "batch 1 (no KV cache)"
    )
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")
    fp32_bytes = len(programs["fp32"].buffer)
    results: dict[str, Any] = {"parameters": params, "load_before": load_before, "load_after": load_after}
    print(f"{'program':<19} {'.pte bytes':>12} {'vs fp32':>8} {'forward ms':>11} {'SQNR dB':>8} {'top-1':>6}  tables")
    for name, program in programs.items():
        out = outputs[name]
        row = {
            "pte_bytes": len(program.buffer),
            "smaller_than_fp32": fp32_bytes / len(program.buffer),
            "forward_ms": lat[name] * 1e3,
            "sqnr_vs_float_db": sqnr(reference, out),
            "top1_agreement": (out.argmax(-1) == reference.argmax(-1)).float().mean().item(),
            "table_kernels": sorted(k for k in program.kernels if "embedding" in k),
        }
        results[name] = row
        print(
            f"{name:<19} {row['pte_bytes']:>12,} {row['smaller_than_fp32']:>7.2f}x {row['forward_ms']:>11.3f} "
            f"{row['sqnr_vs_float_db']:>8.1f} {row['top1_agreement']:>6.3f}  {', '.join(row['table_kernels'])}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

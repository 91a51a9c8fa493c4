"""QAT flow: quantweave-x86 vs torchao's X86InductorQuantizer, prepare_qat_pt2e and convert_pt2e.

On ResNet-18-like (every conv followed by batch norm), one run times, for each flow, on a
fresh training-mode export: ``prepare_qat_pt2e`` (annotation + conv/batch-norm rewrite +
fake-quantizer insertion), ``--steps`` training-mode forward passes (torch's own work, the
same on both sides, shown for scale) and ``convert_pt2e`` (conv/batch-norm folding +
q/dq). It prints the ratios quantweave/torchao and whether the two converted models give
identical outputs. Best of ``--repeat`` for quantweave; torchao's convert takes seconds, so
it runs ``--repeat-peer`` times (default 1).

    python benchmarks/bench_qat.py [--quick] [--repeat N] [--repeat-peer N]
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import quantweave as qw
from quantweave.testing import models

warnings.filterwarnings("ignore")


def quantweave_flow() -> tuple[Callable[..., Any], Callable[..., Any], Callable[[], Any]]:
    from quantweave_x86 import X86InductorQuantizer

    return qw.prepare_qat_pt2e, qw.convert_pt2e, lambda: X86InductorQuantizer(is_qat=True)


def torchao_flow() -> tuple[Callable[..., Any], Callable[..., Any], Callable[[], Any]]:
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    config = xiq.get_default_x86_inductor_quantization_config(is_qat=True)
    return prepare_qat_pt2e, convert_pt2e, lambda: xiq.X86InductorQuantizer().set_global(config)


def measure(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], flow: Any, steps: int, repeat: int) -> dict:
    prepare, convert, make_quantizer = flow
    best: dict[str, float] = {}
    converted = None
    for _ in range(repeat):
        exported = torch.export.export(model, inputs).module()
        start = time.perf_counter()
        prepared = prepare(exported, make_quantizer())
        t_prepare = time.perf_counter() - start
        start = time.perf_counter()
        for i in range(steps):
            prepared(torch.randn(*inputs[0].shape, generator=torch.Generator().manual_seed(i)))
        t_steps = time.perf_counter() - start
        start = time.perf_counter()
        converted = convert(prepared)
        t_convert = time.perf_counter() - start
        for key, value in (("prepare", t_prepare), ("steps", t_steps), ("convert", t_convert)):
            best[key] = min(best.get(key, float("inf")), value)
    best["nodes"] = len(exported.graph.nodes)
    best["converted"] = converted
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="narrow ResNet (width 16, 64 px)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--repeat-peer", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    if args.quick:
        model, image = models.resnet18_like(width=16, num_classes=10), 64
    else:
        model, image = models.resnet18_like(), 224
    model.train()
    inputs = (torch.randn(2, 3, image, image),)
    ours = measure(model, inputs, quantweave_flow(), args.steps, args.repeat)
    theirs = measure(model, inputs, torchao_flow(), args.steps, args.repeat_peer)
    x = torch.randn(*inputs[0].shape, generator=torch.Generator().manual_seed(999))
    with torch.no_grad():
        out, ref = ours["converted"](x), theirs["converted"](x)
    name = "resnet18 (w16, 64px)" if args.quick else "resnet18 (w64, 224px)"
    print(f"QAT, {name}, {ours['nodes']} nodes, batch {inputs[0].shape[0]}, {args.steps} training-mode steps")
    print(f"{'flow':<12} {'prepare_qat':>12} {'steps':>8} {'convert':>9}   (seconds)")
    for label, row in (("quantweave", ours), ("torchao", theirs)):
        print(f"{label:<12} {row['prepare']:>12.3f} {row['steps']:>8.3f} {row['convert']:>9.3f}")
    ratio = (ours["prepare"] + ours["convert"]) / (theirs["prepare"] + theirs["convert"])
    print(
        f"ratio qw/ao: prepare_qat {ours['prepare'] / theirs['prepare']:.2f}x, "
        f"convert {ours['convert'] / theirs['convert']:.3f}x, prepare+convert {ratio:.3f}x; "
        f"outputs max abs diff {(out - ref).abs().max().item():.3g}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

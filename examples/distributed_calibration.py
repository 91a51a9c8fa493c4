"""Calibrate on several processes with torch.distributed; convert and save on rank 0.

    torchrun --nproc-per-node 2 examples/distributed_calibration.py --out DIR

Every rank exports and prepares the same model with the same quantizer (default: the x86
plugin's; ``--quantizer reference`` needs no plugin), calibrates it on its own shard of the
calibration set (interleaved, as ``DistributedSampler(shuffle=False)`` deals it), and calls
``quantweave.distributed.sync_observers``, which merges every observer across the ranks.
Rank 0 then converts, re-exports the converted model and saves ``DIR/model_int8.pt2``
(``torch.export.save``) and ``DIR/summary.json``, and prints a summary. ``--range-pass``
first runs the shard once through ``quantweave.distributed.range_pass`` so that Histogram
observers merge exactly (a second pass over the data). Without torchrun it runs as one
process. On several machines the same script runs unchanged under a multi-node torchrun
(``docs/distributed.md``).

Options: ``--batches N`` (total calibration batches, default 32), ``--batch-size N`` (4),
``--image N`` (64), ``--width N`` (ResNet-18-like width, 16), ``--timeout S`` (bound on
every wait of the synchronization, default 300 s).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import quantweave as qw
import quantweave.distributed as qwd
from quantweave.testing.inspect import sqnr
from quantweave.testing.models import calibration_batches, example_inputs, resnet18_like

warnings.filterwarnings("ignore", message=".*LeafSpec.*")


def get_quantizer(name: str) -> Any:
    if name == "reference":
        from quantweave.testing.reference import make_reference_quantizer

        return make_reference_quantizer(histogram=True)
    return qw.get_quantizer(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--quantizer", default="x86")
    parser.add_argument("--range-pass", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)

    launched = "RANK" in os.environ  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    if launched:
        dist.init_process_group("gloo")  # CPU; "nccl" on GPUs
    rank = dist.get_rank() if launched else 0
    world = dist.get_world_size() if launched else 1

    model = resnet18_like(width=args.width, num_classes=10)  # same weights on every rank (seeded)
    example = example_inputs(model, batch=args.batch_size, image=args.image)
    exported = torch.export.export(model, example).module()
    prepared = qw.prepare_pt2e(exported, get_quantizer(args.quantizer))

    # the calibration set; each rank takes every world-th batch
    batches = calibration_batches(model, args.batches, batch=args.batch_size, image=args.image)
    shard = batches[rank::world]

    start = time.perf_counter()
    # qw.calibrate: each batch checked against the exported inputs, and rolled back if it fails
    if args.range_pass:
        with qwd.range_pass(prepared, timeout=args.timeout):
            qw.calibrate(prepared, shard, progress=False)
    qw.calibrate(prepared, shard, progress=False)
    calibrate_s = time.perf_counter() - start
    summary = qwd.sync_observers(prepared, timeout=args.timeout)

    if rank == 0:
        converted = qw.convert_pt2e(prepared)
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "model_int8.pt2"
        torch.export.save(torch.export.export(converted, example), path)
        with torch.no_grad():
            reloaded = torch.export.load(path).module()
            round_trip = torch.equal(reloaded(*example), converted(*example))
            quality = sqnr(model(*example), converted(*example))
        record = {
            "world_size": world,
            "quantizer": args.quantizer,
            "batches": args.batches,
            "shard_batches": len(shard),
            "calibrate_seconds_rank0": round(calibrate_s, 3),
            "sync_seconds": round(summary.seconds, 4),
            "merged": summary.merged,
            "exact": summary.exact,
            "rebinned": len(summary.rebinned),
            "uncalibrated": list(summary.uncalibrated),
            "payload_bytes": summary.payload_bytes,
            "sqnr_db": round(quality, 2),
            "round_trip_identical": round_trip,
            "saved": str(path),
        }
        (args.out / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
        print(f"ranks            {world} (shard of {len(shard)} of {args.batches} batches on rank 0)")
        print(
            f"calibrate        {calibrate_s:.3f} s on rank 0{' (range pass + calibration)' if args.range_pass else ''}"
        )
        print(f"sync_observers   {summary.seconds * 1e3:.1f} ms, {summary.payload_bytes} bytes from each rank")
        print(f"merged           {', '.join(f'{k} {v}' for k, v in sorted(summary.merged.items()))}")
        print(
            f"exact            {summary.exact} ({len(summary.rebinned)} histograms re-binned, "
            f"{len(summary.averaged)} moving averages)"
        )
        print(f"SQNR vs float    {quality:.2f} dB")
        print(f"saved            {path} (reloads with identical outputs: {round_trip})")
    if launched:
        dist.barrier()  # the other ranks wait until rank 0 has saved
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

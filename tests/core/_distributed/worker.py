"""One rank of a 2-process test launch: ``python -m tests.core._distributed.worker`` (from the
repository root) with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as torchrun would.

``--launch main`` runs every scenario of ``scenarios.MAIN`` in order on one gloo process
group (the failing ones end with every rank raising at the same step, so the group stays
usable); ``--launch dead`` / ``late`` run ``scenarios.failure`` in that mode. Results go to
``<out>/rank<R>.pt`` (torch.save), written even when a scenario raises unexpectedly.
"""

from __future__ import annotations

import argparse
import datetime
import os
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from tests.core._distributed import scenarios


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launch", choices=("main", "dead", "late"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    # the process group's own timeout is a backstop only: every wait of the code under test
    # has its own, shorter bound
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    results: dict[str, object] = {}
    try:
        if args.launch == "main":
            for name, scenario in scenarios.MAIN.items():
                results[name] = scenario(rank)
        else:
            results[args.launch] = scenarios.failure(rank, args.launch)
    except BaseException:
        results["crash"] = traceback.format_exc()
    torch.save(results, args.out / f"rank{rank}.pt")
    if args.launch == "main" and "crash" not in results:
        dist.destroy_process_group()
    os._exit(0)  # a failure launch leaves a broken group behind: do not wait on it


if __name__ == "__main__":
    main()

"""CPU time of ``prepare_pt2e`` and ``convert_pt2e`` on bench_8da4w.py's model (issue 25).

The quantize step of ``bench_8da4w.py`` (``ExecuTorchQuantizer("llm", linear_bits=4,
linear_group_size=32, embedding_bits=4, embedding_group_size=32)`` on ``tiny_decoder_lm()``),
split into prepare, convert and the converted model's code generation on first use, as the
median CPU time (``time.process_time``) of ``--runs`` runs in this process, plus their wall
time and the load average. CPU time of a single-threaded process varies less under load than
wall time; compare two versions by running this in separate processes, alternated
(``PYTHONPATH`` pointing at each tree), and read figures from a loaded machine as such.

    OMP_NUM_THREADS=1 python benchmarks/cpu_8da4w_quantize.py [--threads 1] [--runs 7] [--label new]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(args.threads)
    import quantweave as qw
    import quantweave_executorch as qe
    from quantweave.testing.models import lm_prompts, tiny_decoder_lm

    model = tiny_decoder_lm(vocab=32000)
    exported = torch.export.export(model, (lm_prompts(model, 1),)).module()

    def once() -> tuple[float, float, float, float]:
        quantizer = qe.ExecuTorchQuantizer(
            "llm", linear_bits=4, linear_group_size=32, embedding_bits=4, embedding_group_size=32
        )
        cpu0, wall0 = time.process_time(), time.perf_counter()
        prepared = qw.prepare_pt2e(exported, quantizer)
        cpu1 = time.process_time()
        converted = qw.convert_pt2e(prepared)
        cpu2, wall2 = time.process_time(), time.perf_counter()
        assert converted.code  # generated on first use (or already, by convert)
        return cpu1 - cpu0, cpu2 - cpu1, time.process_time() - cpu2, wall2 - wall0

    for _ in range(2):  # warm-up: imports, first calls
        once()
    runs = [once() for _ in range(args.runs)]
    prepare, convert, code, wall = (statistics.median(r[i] for r in runs) * 1e3 for i in range(4))
    print(
        f"{args.label} threads {args.threads}: prepare {prepare:.1f} ms, convert {convert:.1f} ms CPU "
        f"(+ the converted model's code on first use {code:.1f} ms); prepare + convert wall {wall:.1f} ms; "
        f"median of {args.runs}; load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()

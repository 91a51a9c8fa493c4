"""Check and measure the test session's lowering shortcuts (tests/executorch_speedups.py) outside pytest:
``python -m tests._lowering_check [--rounds N] [--profile FILE] [NAME ...]`` (needs ExecuTorch 1.5.1; the
zoo programs need transformers: /work/venv-zoo).

Builds a set of converted (and float) programs like the zoo, tests/xnnpack and tests/executorch_plugin do,
then lowers each one ``--rounds`` times in each mode, interleaved (plain, shortcuts, plain, ...):

- ``plain``: the session's older shortcuts only (the CIA-op walk memo, shared ``NodeSource`` records),
- ``new``: those and :func:`tests.executorch_speedups.lowering_speedups` (every newer shortcut),

and prints per program the sha256 of the .pte bytes of every lowering (all must be equal), the median CPU
seconds (``time.process_time``, one thread) per mode and their ratio, the counts of the new shortcuts, and
the load average. Exit status 1 when any program's bytes differ. ``--profile FILE`` writes a cProfile of
one ``new`` lowering of the first program named instead.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import quantweave as qw


def _zoo(name: str, plugin: str, float_model: bool = False) -> Callable[[], Callable[[], bytes]]:
    def build() -> Callable[[], bytes]:
        from tests.zoo import measure

        zoo = measure.zoo_model(name)
        model: Any = zoo.model
        if not float_model:
            ours, _ = measure._quantizers(plugin)
            model = measure._flow(zoo, measure.exported(name), ours, qw.prepare_pt2e, qw.convert_pt2e)
        return _lowering(plugin, model, zoo.inputs)

    return build


def _lowering(plugin: str, model: Any, inputs: tuple[Any, ...]) -> Callable[[], bytes]:
    if plugin == "xnnpack":
        import quantweave_xnnpack as qx

        return lambda: qx.to_executorch(model, inputs).buffer
    import quantweave_executorch as qe

    return lambda: qe.to_executorch(model, inputs).buffer


def _xnnpack_case(model_name: str, config_name: str) -> Callable[[], Callable[[], bytes]]:
    def build() -> Callable[[], bytes]:
        from tests.xnnpack import _cases

        converted, inputs = _cases.ours(model_name, config_name)
        return _lowering("xnnpack", converted, inputs)

    return build


def _tied_lm() -> Callable[[], bytes]:
    import quantweave_executorch as qe
    from quantweave.testing.models import lm_prompts, tiny_decoder_lm

    model = tiny_decoder_lm(vocab=256, dim=64, layers=1, heads=2, max_seq=16, tied=True)
    prompts = lm_prompts(model, 2)
    quantizer = qe.ExecuTorchQuantizer(
        "llm", linear_bits=4, linear_group_size=32, embedding_bits=4, embedding_group_size=32
    )
    prepared = qw.prepare_pt2e(torch.export.export(model, (prompts[:1],)).module(), quantizer)
    qw.calibrate(prepared, [(prompts[i : i + 1],) for i in range(2)], progress=False)
    return _lowering("llm", qw.convert_pt2e(prepared), (prompts[:1],))


#: name -> builder of a lowering (a callable returning the .pte bytes)
PROGRAMS: dict[str, Callable[[], Callable[[], bytes]]] = {
    "zoo_resnet_xnnpack": _zoo("resnet", "xnnpack"),
    "zoo_resnet_float": _zoo("resnet", "xnnpack", float_model=True),
    "zoo_llama_xnnpack": _zoo("llama", "xnnpack"),
    "zoo_bert_llm": _zoo("bert", "llm"),
    "zoo_gpt2_float_llm": _zoo("gpt2", "llm", float_model=True),
    "xnnpack_mobilenet_per_channel": _xnnpack_case("mobilenet_v2", "static_per_channel"),
    "xnnpack_transformer_dynamic": _xnnpack_case("transformer_block", "dynamic"),
    "xnnpack_decoder_per_tensor": _xnnpack_case("conv_transpose_decoder", "static_per_tensor"),
    "executorch_tied_lm_8da4w": _tied_lm,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"programs (default: all): {', '.join(PROGRAMS)}")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", metavar="FILE")
    args = parser.parse_args(argv)
    names = args.names or list(PROGRAMS)
    from tests import executorch_speedups as es

    with contextlib.ExitStack() as stack:
        for generator in (es.cia_ops_collected_once(), es.node_sources_shared()):
            next(generator)
            stack.callback(generator.close)
        lowerings = {}
        for name in names:
            torch.manual_seed(0)
            lowerings[name] = PROGRAMS[name]()
        if args.profile:
            with es.lowering_speedups() as stats:
                lowerings[names[0]]()  # warm
                profile = cProfile.Profile(time.process_time)
                profile.runcall(lowerings[names[0]])
            profile.dump_stats(args.profile)
            print(f"profile of {names[0]} written to {args.profile}; {dict(stats)}")
            return 0
        next(iter(lowerings.values()))()  # warm: first-use costs (imports, kernels, the CIA walk) not measured
        failed = False
        for name, lower in lowerings.items():
            seconds: dict[str, list[float]] = {"plain": [], "new": []}
            digests = set()
            stats: dict = {}
            for _ in range(args.rounds):
                for mode in ("plain", "new"):
                    with es.lowering_speedups() if mode == "new" else contextlib.nullcontext({}) as counted:
                        start = time.process_time()
                        buffer = lower()
                        seconds[mode].append(time.process_time() - start)
                    digests.add(hashlib.sha256(buffer).hexdigest()[:16])
                    if mode == "new":
                        stats = dict(counted)
            plain, new = (statistics.median(seconds[m]) for m in ("plain", "new"))
            same = len(digests) == 1
            failed |= not same
            print(
                f"{name}: {'identical' if same else 'DIFFERENT'} {sorted(digests)} plain {plain:.2f} s, "
                f"new {new:.2f} s CPU (x{new / plain:.2f}); {stats}; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU seconds and call counts per step of ``quantweave_onnxruntime.to_onnx`` (issue 28).

One process, one torch thread: quantizes the model twice (torch.export, prepare, calibrate,
convert, to_onnx) and prints, for the second, the CPU seconds (``time.process_time``) of each
phase and of the exporter's steps (its torch.export capture, the decomposition step with
``run_decompositions``, torch's collection of CompositeImplicitAutograd ops and the
decomposition table, type promotion, translation, each ONNX optimizer pass), with how often
each ran. Counts do not depend on the machine's load; seconds do (the load average is printed).
Run it with a tree before and after a change, back to back, to compare:

    OMP_NUM_THREADS=1 python benchmarks/profile_onnxruntime_export.py cnn [--observer minmax]
"""

from __future__ import annotations

import argparse
import collections
import importlib
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnx_ir as ir
import torch

import quantweave as qw
from quantweave_onnxruntime import ORTQuantizer, to_onnx
from quantweave_onnxruntime.testing import BENCH_MODELS

#: (label, module, class or None, attribute) of the steps timed and counted
STEPS = (
    ("torch.export.export", "torch.export", None, "export"),
    ("program (no trace)", "quantweave_onnxruntime._program", None, "exported_program"),
    ("decompose_with_registry", "torch.onnx._internal.exporter._fx_passes", None, "decompose_with_registry"),
    ("run_decompositions", "torch.export.exported_program", "ExportedProgram", "run_decompositions"),
    ("_collect_all_valid_cia_ops", "torch.export.exported_program", None, "_collect_all_valid_cia_ops"),
    ("_collect_all_valid_cia_ops", "torch.export.decomp_utils", None, "_collect_all_valid_cia_ops"),
    ("decomposition table", "torch.onnx._internal.exporter._decomp", None, "create_onnx_friendly_decomposition_table"),
    ("type promotion", "torch.onnx._internal.exporter._fx_passes", None, "insert_type_promotion_nodes"),
    ("translate", "torch.onnx._internal.exporter._core", None, "_exported_program_to_onnx_program"),
    ("ONNXProgram.optimize", "torch.onnx._internal.exporter._onnx_program", "ONNXProgram", "optimize"),
    ("onnx_fusions.fuse", "onnxscript.rewriter.onnx_fusions", None, "fuse"),
    ("save", "torch.onnx._internal.exporter._onnx_program", "ONNXProgram", "save"),
)


@contextmanager
def clocked(seconds: collections.Counter[str], calls: collections.Counter[str]) -> Iterator[None]:
    saved: list[tuple[Any, str, Any]] = []
    for label, module_name, owner_name, attribute in STEPS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a module of to_onnx that a tree before it does not have
            continue
        owner = getattr(module, owner_name) if owner_name else module
        raw = owner.__dict__[attribute] if owner_name else getattr(owner, attribute)
        saved.append((owner, attribute, raw))

        def timed(*args: Any, _f: Any = raw, _label: str = label, **kwargs: Any) -> Any:
            calls[_label] += 1
            start = time.process_time()
            try:
                return _f(*args, **kwargs)
            finally:
                seconds[_label] += time.process_time() - start

        setattr(owner, attribute, timed)
    pass_call = ir.passes.PassBase.__call__

    def timed_pass(self: Any, model: Any) -> Any:
        name = type(self).__name__
        start = time.process_time()
        try:
            return pass_call(self, model)
        finally:
            if name not in ("Sequential", "PassManager"):  # their passes are counted
                seconds[f"pass {name}"] += time.process_time() - start
                calls[f"pass {name}"] += 1

    ir.passes.PassBase.__call__ = timed_pass  # type: ignore[method-assign]
    try:
        yield
    finally:
        ir.passes.PassBase.__call__ = pass_call  # type: ignore[method-assign]
        for owner, attribute, raw in reversed(saved):
            setattr(owner, attribute, raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("model", choices=list(BENCH_MODELS))
    parser.add_argument("--observer", choices=("histogram", "minmax"), default="histogram")
    parser.add_argument("--dynamic", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    factory, make = BENCH_MODELS[args.model]
    torch.manual_seed(0)
    model = factory().eval()
    torch.manual_seed(1)
    batches = [make() for _ in range(8)]
    x = make()
    seconds: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    phases: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(2):  # the first pays the process's first-call costs
            phases.clear()
            start = time.process_time()
            exported = torch.export.export(model, (x,)).module()
            phases["torch.export"] = time.process_time() - start
            start = time.process_time()
            quantizer = ORTQuantizer(is_dynamic=args.dynamic, observer=args.observer)
            prepared = qw.prepare_pt2e(exported, quantizer)
            phases["prepare"] = time.process_time() - start
            start = time.process_time()
            qw.calibrate(prepared, batches[: 1 if args.dynamic else None], progress=False)
            phases["calibrate"] = time.process_time() - start
            start = time.process_time()
            converted = qw.convert_pt2e(prepared)
            phases["convert"] = time.process_time() - start
            seconds.clear()
            calls.clear()
            start = time.process_time()
            with clocked(seconds, calls):
                to_onnx(converted, (x,), Path(tmp) / "model.onnx")
            phases["to_onnx"] = time.process_time() - start
    mode = "dynamic" if args.dynamic else "static"
    print(f"{args.model} ({mode}), observer {args.observer}, CPU s, 1 thread; load {os.getloadavg()[0]:.2f}")
    for label, value in phases.items():
        print(f"  {label:38} {value:7.2f}")
    for label, value in sorted(seconds.items(), key=lambda item: -item[1]):
        print(f"    {label:36} {value:7.2f}  x{calls[label]}")
    not_run = sorted({label for label, *_ in STEPS} - set(calls))
    print(f"    not run: {', '.join(not_run) or '-'}")


if __name__ == "__main__":
    main()

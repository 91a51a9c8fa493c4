"""Where the zoo's CPU goes (issue #23): with ``QUANTWEAVE_ZOO_COUNTS=PATH`` the zoo's session
counts its expensive steps and the CPU seconds spent in them (inclusive: an export inside a
lowering is in both) and writes them to PATH at the end, one step a line. Counts do not depend
on the machine's load; the seconds do (``time.process_time`` of this process).

Counted (calls through these names, as the zoo and the plugins make them):
``torch.export.export``; ``quantweave.prepare_pt2e`` / ``convert_pt2e`` and torchao's; inductor
compiles (``GraphLowering.compile_to_module``); ExecuTorch's ``to_edge_transform_and_lower`` and
``EdgeProgramManager.to_executorch``; program loads on the ExecuTorch runtime. Without the
variable nothing is patched. The last lines give the process's own CPU and its children's
(``children``: the processes it waited for, inductor's g++ kernel compiles, which the per-step
figures do not include: 140 of 523 CPU s of the env with a cold inductor cache, measured).
"""

from __future__ import annotations

import collections
import functools
import importlib
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: (module, owner attribute path or "", function) counted; a module that is not installed is skipped
STEPS = (
    ("torch.export", "", "export"),
    ("quantweave", "", "prepare_pt2e"),
    ("quantweave", "", "convert_pt2e"),
    ("torchao.quantization.pt2e.quantize_pt2e", "", "prepare_pt2e"),
    ("torchao.quantization.pt2e.quantize_pt2e", "", "convert_pt2e"),
    ("torch._inductor.graph", "GraphLowering", "compile_to_module"),
    ("executorch.exir", "", "to_edge_transform_and_lower"),
    ("executorch.exir.program._program", "EdgeProgramManager", "to_executorch"),
    ("quantweave_xnnpack._executorch", "ExecuTorchProgram", "load"),
)


def _counted(function: Any, name: str, calls: collections.Counter, seconds: collections.Counter) -> Any:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[name] += time.process_time() - start

    return wrapper


def render(calls: collections.Counter, seconds: collections.Counter) -> str:
    lines = [f"{name}\t{calls[name]}\t{seconds[name]:.1f}" for name in sorted(calls)]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines += [f"process\t-\t{time.process_time():.1f}", f"children\t-\t{children.ru_utime + children.ru_stime:.1f}"]
    return "step\tcalls\tCPU s (inclusive)\n" + "\n".join(lines) + "\n"


def counting(path: str) -> Iterator[tuple[collections.Counter, collections.Counter]]:
    """For a session fixture: patch the :data:`STEPS` for the session, yield (calls, seconds),
    write them to ``path`` at the end."""
    calls: collections.Counter = collections.Counter()
    seconds: collections.Counter = collections.Counter()
    patch = pytest.MonkeyPatch()
    for module_name, owner_path, attr in STEPS:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        for part in filter(None, owner_path.split(".")):
            owner = getattr(owner, part)
        name = ".".join(filter(None, (module_name, owner_path, attr)))
        patch.setattr(owner, attr, _counted(getattr(owner, attr), name, calls, seconds))
    try:
        yield calls, seconds
    finally:
        patch.undo()
        Path(path).write_text(render(calls, seconds))

"""How often a test session lowers the same program twice (issue #23: would a memo of identical
lowerings pay?). With ``QUANTWEAVE_LOWERING_REPEATS=PATH`` every ``to_edge_transform_and_lower`` of
the session is given a content key -- each program's graph code, the bytes of its parameters,
buffers and constants, the partitioners' classes and attributes (``repr``), the compile config --
and PATH gets, at the end, the number of lowerings, of distinct keys, and the CPU seconds spent in
the keying and in the lowerings that repeated an earlier key. Nothing is reused: this only counts.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import importlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from tests.executorch_speedups import modules_binding

ENV = "QUANTWEAVE_LOWERING_REPEATS"
MODULE, NAME = "executorch.exir.program._program", "to_edge_transform_and_lower"


def _describe(value: Any, depth: int = 0) -> str:
    """A repr of ``value`` without object ids: classes and public attributes, a few levels down."""
    if depth > 4:
        return "..."
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_describe(v, depth + 1) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_describe(v, depth + 1)}" for k, v in sorted(value.items(), key=str)) + "}"
    if isinstance(value, (str, int, float, bool, type(None))):
        return repr(value)
    if isinstance(value, type) or (callable(value) and not hasattr(value, "__dict__")):
        return getattr(value, "__qualname__", type(value).__qualname__)
    attributes = getattr(value, "__dict__", None)
    if attributes is None:
        return type(value).__qualname__
    inner = ",".join(f"{k}={_describe(v, depth + 1)}" for k, v in sorted(attributes.items()) if not k.startswith("_"))
    return f"{type(value).__qualname__}({inner})"


def key(programs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The content key of a ``to_edge_transform_and_lower`` call."""
    digest = hashlib.sha256()
    for name, program in sorted(programs.items()) if isinstance(programs, dict) else [("forward", programs)]:
        digest.update(name.encode())
        digest.update(program.graph_module.code.encode())
        digest.update(repr(program.graph_signature).encode())
        tensors = {**program.state_dict, **program.constants}
        for tensor_name, tensor in sorted(tensors.items()):
            digest.update(tensor_name.encode())
            if isinstance(tensor, torch.Tensor):
                digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
                digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    digest.update(_describe(args).encode())
    digest.update(_describe(kwargs).encode())
    return digest.hexdigest()


@contextlib.contextmanager
def counting(path: str) -> Iterator[collections.Counter]:
    try:
        module = importlib.import_module(MODULE)
    except ImportError:
        yield collections.Counter()
        return
    original = getattr(module, NAME)
    stats: collections.Counter = collections.Counter()
    seen: set[str] = set()

    @functools.wraps(original)
    def counted(programs: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            content = key(programs, args, kwargs)
        except Exception:  # a tensor subclass without bytes (torchao's quantized weights): never a repeat
            content = None
            stats["not keyed"] += 1
        stats["keying CPU s"] += time.process_time() - start
        stats["lowerings"] += 1
        repeated = content in seen
        if content is not None:
            seen.add(content)
        start = time.process_time()
        try:
            return original(programs, *args, **kwargs)
        finally:
            if repeated:
                stats["repeats"] += 1
                stats["repeats' CPU s"] += time.process_time() - start

    bound = modules_binding(NAME, original)
    for m in bound:
        setattr(m, NAME, counted)
    try:
        yield stats
    finally:
        for m in bound:
            setattr(m, NAME, original)
        with open(path, "a") as f:
            f.write(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items()) + "\n")

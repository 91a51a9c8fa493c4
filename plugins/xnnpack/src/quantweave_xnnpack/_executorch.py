"""Lower a converted model to an ExecuTorch program with the XNNPACK partitioner.

ExecuTorch is the optional extra ``quantweave-xnnpack[executorch]``: it is imported only
when :func:`to_executorch` (or :meth:`ExecuTorchProgram.load`) is called.

The steps are public so that other lowerings (``quantweave-executorch``) reuse them:
:func:`import_executorch` (import an ExecuTorch module, or raise
:class:`ExecuTorchNotInstalledError` saying what to install), :func:`lower_to_edge`
(``torch.export`` then ``to_edge_transform_and_lower`` with the ``XnnpackPartitioner``, and
what it delegated: :class:`Delegation`), :func:`op_name` and :func:`is_plumbing`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from quantweave.authoring import products_as_linears

from . import _accept

__all__ = [
    "Delegation",
    "ExecuTorchNotInstalledError",
    "ExecuTorchProgram",
    "LoadedProgram",
    "PLUMBING",
    "import_executorch",
    "is_plumbing",
    "lower_to_edge",
    "op_name",
    "to_executorch",
]

#: op names of graph nodes that are plumbing, not computation (matched as substrings; ``alloc``
#: appears in programs after ``to_executorch``)
PLUMBING = ("alloc", "getitem", "executorch_call_delegate")


class ExecuTorchNotInstalledError(ImportError):
    """ExecuTorch (the ``executorch`` extra) is needed and not installed."""


def import_executorch(
    module: str, *, caller: str = "quantweave_xnnpack.to_executorch", distribution: str = "quantweave-xnnpack"
) -> Any:
    """``importlib.import_module(module)`` for an ExecuTorch module; when it cannot be imported,
    raises :class:`ExecuTorchNotInstalledError` naming ``caller``, the module and how to install
    ExecuTorch (with ``distribution``'s ``executorch`` extra)."""
    try:
        with _quiet_imports():
            return importlib.import_module(module)
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing and missing not in ("executorch", "torchao") and _installed("executorch"):
            raise ExecuTorchNotInstalledError(  # ExecuTorch is there: name what it lacks, not ExecuTorch
                f"{caller}: ExecuTorch is installed, but importing {module} failed: it needs {missing!r}, which is "
                f"not installed ({exc}). Install it with: pip install {_DISTRIBUTIONS.get(missing, missing)}"
            ) from exc
        raise ExecuTorchNotInstalledError(
            f"{caller} needs ExecuTorch 1.5.1 ({module} could not be imported: {exc}). Install it with: "
            "pip install --no-deps torchao==0.18.0 executorch==1.5.1 && pip install ruamel.yaml flatbuffers "
            f"tabulate (or `pip install '{distribution}[executorch]'`, which also pulls ExecuTorch's declared but "
            "unused heavy requirements); keep torch==2.13.0"
        ) from exc


#: loggers whose import-time lines ExecuTorch's import brings and a user cannot act on: torchao
#: logs a "Failed to load" line per CUDA kernel library it ships (none load with a CPU torch), and
#: torch's pytree a deprecation line for an enum torchao registers. Quieted to errors while
#: :func:`import_executorch` imports, then restored: this is the only place quantweave filters
#: what a dependency emits; nothing is filtered for the user's own imports or calls.
QUIET_AT_IMPORT = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def _quiet_imports() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in QUIET_AT_IMPORT]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.ERROR))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or stubbed entry in sys.modules
        return False


#: the distribution to install for a module ExecuTorch imports (where the names differ)
_DISTRIBUTIONS = {"ruamel": "ruamel.yaml", "yaml": "pyyaml"}


def op_name(node: torch.fx.Node) -> str:
    """The name of a node's op as the program summaries count it: ``str(op)`` for a torch
    ``OpOverload`` (``"quantized_decomposed.embedding_4bit.out"``), else its ``__name__``
    (edge ops: ``"aten.linear.default"``)."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return str(getattr(target, "__name__", None) or target)


def is_plumbing(name: str) -> bool:
    """True for the op names (:func:`op_name`) of plumbing nodes (:data:`PLUMBING`): getitem,
    delegate calls, memory planning's alloc."""
    return any(p in name for p in PLUMBING)


@dataclass(frozen=True)
class Delegation:
    """What the XNNPACK partitioner took: ``delegated`` counts, per op, the nodes inside XNNPACK
    delegates; ``not_delegated`` the compute nodes left outside (plumbing not counted)."""

    delegated: Mapping[str, int]
    not_delegated: Mapping[str, int]
    delegate_count: int


def lower_to_edge(
    model: torch.nn.Module,
    example_inputs: Sequence[Any],
    *,
    dynamic_shapes: Any = None,
    partitioner_options: Mapping[str, Any] | None = None,
    compile_config: Any = None,
    caller: str = "quantweave_xnnpack.lower_to_edge",
) -> tuple[Any, Delegation]:
    """``torch.export`` ``model``, then ExecuTorch's ``to_edge_transform_and_lower`` with an
    ``XnnpackPartitioner(**partitioner_options)`` (and ``compile_config``, an
    ``executorch.exir.EdgeCompileConfig``). Returns the ``EdgeProgramManager`` (serialize it
    with its ``to_executorch(...)``) and the :class:`Delegation`. ``caller`` names the API in
    the error raised when ExecuTorch is missing."""
    exir = import_executorch("executorch.exir", caller=caller)
    import_executorch("executorch.backends.xnnpack.partition.xnnpack_partitioner", caller=caller)
    if isinstance(model, torch.fx.GraphModule):
        model = products_as_linears(model)  # addmm / mm / matmul of an [in, out] int8 weight as linear
    exported = torch.export.export(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    # the partitioner keeps out what the XNNPACK runtime would refuse at load (_accept.REFUSALS)
    kwargs: dict[str, Any] = {"partitioner": [_accept.xnnpack_partitioner(partitioner_options)]}
    if compile_config is not None:
        kwargs["compile_config"] = compile_config
    edge = exir.to_edge_transform_and_lower(exported, **kwargs)
    delegated: Counter[str] = Counter()
    not_delegated: Counter[str] = Counter()
    delegates = 0
    graph_module = edge.exported_program().graph_module
    for node in graph_module.graph.nodes:
        if node.op == "get_attr" and str(node.target).startswith("lowered_module"):
            delegates += 1
            for inner in getattr(graph_module, str(node.target)).original_module.graph.nodes:
                if inner.op == "call_function" and not is_plumbing(op_name(inner)):
                    delegated[op_name(inner)] += 1
        elif node.op == "call_function" and not is_plumbing(op_name(node)):
            not_delegated[op_name(node)] += 1
    return edge, Delegation(dict(delegated), dict(not_delegated), delegates)


@dataclass(frozen=True)
class ExecuTorchProgram:
    """A serialized ExecuTorch program and what the XNNPACK partitioner took.

    ``delegated`` counts, per op, the nodes inside XNNPACK delegates; ``not_delegated`` the
    compute nodes left to ExecuTorch's portable kernels (plumbing such as ``getitem`` and
    the delegate calls themselves are not counted)."""

    buffer: bytes
    delegated: Mapping[str, int] = field(default_factory=dict)
    not_delegated: Mapping[str, int] = field(default_factory=dict)
    delegate_count: int = 0

    def summary(self) -> str:
        def lines(counts: Mapping[str, int]) -> str:
            return "\n".join(f"  {op}: {n}" for op, n in sorted(counts.items())) or "  (none)"

        return (
            f"{self.delegate_count} XNNPACK delegate(s), {len(self.buffer)} bytes\n"
            f"delegated ({sum(self.delegated.values())} nodes):\n{lines(self.delegated)}\n"
            f"not delegated ({sum(self.not_delegated.values())} nodes):\n{lines(self.not_delegated)}"
        )

    def load(self) -> LoadedProgram:
        """Load the program on the ExecuTorch runtime (``executorch.runtime``)."""
        runtime = import_executorch("executorch.runtime", caller="ExecuTorchProgram.load")
        with _quiet_native_lines():
            return LoadedProgram(runtime.Runtime.get().load_program(self.buffer))

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            f.write(self.buffer)


class LoadedProgram:
    """A program loaded on the ExecuTorch runtime; call it like the model.

    Holds the runtime's program object for as long as its method is used (the method
    does not keep it alive; dropping it early crashes)."""

    def __init__(self, program: Any) -> None:
        self._program = program
        self._method = program.load_method("forward")
        self._first = True

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        if self._first:  # the runtime's thread pool starts on the first call
            self._first = False
            with _quiet_native_lines():
                return list(self._method.execute(list(inputs)))
        return list(self._method.execute(list(inputs)))


#: lines ExecuTorch's runtime writes to the process's standard error (from C++) when its thread
#: pool starts, about reading CPU registers that do not exist on x86 -- nothing a user can act on
NATIVE_NOISE = ("[cpuinfo_utils.cpp:",)


@contextlib.contextmanager
def _quiet_native_lines() -> Iterator[None]:
    """Run with file descriptor 2 sent to a temporary file; then write back to standard error
    every line but :data:`NATIVE_NOISE`'s (errors and anything else the runtime says stay)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (a notebook, a test capture)
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not line.startswith(NATIVE_NOISE_B)]
            if kept:
                sys.stderr.flush()
                os.write(fd, b"".join(kept))


NATIVE_NOISE_B = tuple(prefix.encode() for prefix in NATIVE_NOISE)


def to_executorch(
    converted: torch.nn.Module,
    example_inputs: Sequence[Any],
    *,
    dynamic_shapes: Any = None,
    partitioner_options: Mapping[str, Any] | None = None,
    compile_config: Any = None,
    backend_config: Any = None,
) -> ExecuTorchProgram:
    """Export ``converted`` (a ``quantweave.convert_pt2e`` result, or any float model),
    lower it with ExecuTorch's ``XnnpackPartitioner`` (``to_edge_transform_and_lower``) and
    serialize it (``to_executorch``).

    ``partitioner_options`` go to ``XnnpackPartitioner(**options)``; ``compile_config`` is an
    ``executorch.exir.EdgeCompileConfig`` and ``backend_config`` an
    ``executorch.exir.ExecutorchBackendConfig``. Raises :class:`ExecuTorchNotInstalledError`,
    saying what to install, when ExecuTorch is missing."""
    edge, delegation = lower_to_edge(
        converted,
        example_inputs,
        dynamic_shapes=dynamic_shapes,
        partitioner_options=partitioner_options,
        compile_config=compile_config,
        caller="quantweave_xnnpack.to_executorch",
    )
    program = edge.to_executorch(backend_config) if backend_config is not None else edge.to_executorch()
    return ExecuTorchProgram(
        bytes(program.buffer), delegation.delegated, delegation.not_delegated, delegation.delegate_count
    )

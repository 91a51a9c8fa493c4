"""Lower a converted model to an ExecuTorch program with the XNNPACK partitioner.

ExecuTorch is the optional extra ``quantweave-xnnpack[executorch]``: it is imported only
when :func:`to_executorch` (or :meth:`ExecuTorchProgram.load`) is called.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["ExecuTorchNotInstalledError", "ExecuTorchProgram", "LoadedProgram", "to_executorch"]

_INSTALL = (
    "pip install --no-deps torchao==0.18.0 executorch==1.5.1 && pip install ruamel.yaml flatbuffers tabulate "
    "(or `pip install 'quantweave-xnnpack[executorch]'`, which also pulls ExecuTorch's declared but unused "
    "heavy requirements); keep torch==2.13.0"
)
#: graph nodes that are plumbing, not computation
_PLUMBING = ("getitem", "executorch_call_delegate")


class ExecuTorchNotInstalledError(ImportError):
    """ExecuTorch (the ``executorch`` extra) is needed and not installed."""


def _require(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ExecuTorchNotInstalledError(
            f"quantweave_xnnpack.to_executorch needs ExecuTorch 1.5.1 ({module} could not be imported: {exc}). "
            f"Install it with: {_INSTALL}"
        ) from exc


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    name = getattr(target, "__name__", None) or str(target)
    return str(name)


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
        runtime = _require("executorch.runtime")
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

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        return list(self._method.execute(list(inputs)))


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
    exir = _require("executorch.exir")
    partition = _require("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    exported = torch.export.export(converted, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    kwargs: dict[str, Any] = {"partitioner": [partition.XnnpackPartitioner(**dict(partitioner_options or {}))]}
    if compile_config is not None:
        kwargs["compile_config"] = compile_config
    edge = exir.to_edge_transform_and_lower(exported, **kwargs)
    delegated: Counter[str] = Counter()
    not_delegated: Counter[str] = Counter()
    delegates = 0
    graph_module = edge.exported_program().graph_module
    for node in graph_module.graph.nodes:
        if node.op == "get_attr" and node.target.startswith("lowered_module"):
            lowered = getattr(graph_module, node.target)
            delegates += 1
            for inner in lowered.original_module.graph.nodes:
                if inner.op == "call_function" and _op_name(inner) not in _PLUMBING:
                    delegated[_op_name(inner)] += 1
        elif node.op == "call_function" and _op_name(node) not in _PLUMBING:
            not_delegated[_op_name(node)] += 1
    program = edge.to_executorch(backend_config) if backend_config is not None else edge.to_executorch()
    return ExecuTorchProgram(bytes(program.buffer), dict(delegated), dict(not_delegated), delegates)

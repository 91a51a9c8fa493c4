"""Lower a converted (q/dq) model to real int8 kernels with inductor.

``lower(converted, example_inputs)`` re-exports the converted model, compiles it with
inductor and *freezing* (which lets inductor's x86 passes fold the quantize/dequantize
patterns into oneDNN int8 convolutions and linears) and returns a :class:`LoweredModule`.

- No global side effects: freezing (and autocast for ``bf16=True``) is switched on only
  around the module's own calls; importing this module changes no configuration.
- The caller's input tensors are never mutated. Inductor's int8 binary fusion can write
  the result of ``x + f(x)`` into ``x``'s buffer when ``x`` is a graph input; the module
  hands the compiled code private copies of its tensor inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.fx import GraphModule

from quantweave.convert import dequantize_ops

__all__ = ["LoweredModule", "lower"]


class LoweredModule:
    """A compiled quantized model. Call it like the model; inputs are left untouched."""

    def __init__(self, compiled: Any, bf16: bool) -> None:
        self._compiled = compiled
        self.bf16 = bf16

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        import torch._inductor.config as inductor_config

        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(inductor_config.patch(freezing=True))
            if self.bf16:
                stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
            yield

    def __call__(self, *args: Any) -> Any:
        private = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        with self._context():
            return self._compiled(*private)


def lower(converted: GraphModule, example_inputs: Sequence[Any], *, bf16: bool = False) -> LoweredModule:
    """Compile ``converted`` (from ``quantweave.convert_pt2e``) for x86 int8 inference.

    ``example_inputs`` must match the shapes the model was exported with. ``bf16=True``
    runs the non-quantized parts in bfloat16 (int8-mixed-bf16). Compilation happens here,
    on ``example_inputs``, so the first real call is fast.
    """
    if not isinstance(converted, GraphModule):
        raise TypeError(
            f"lower expects the GraphModule returned by quantweave.convert_pt2e; got {type(converted).__name__}"
        )
    if not isinstance(bf16, bool):
        raise TypeError(f"lower: bf16 must be a bool; got {bf16!r}")
    dq = dequantize_ops()
    if not any(n.op == "call_function" and n.target in dq for n in converted.graph.nodes):
        raise ValueError(
            "lower expects a converted model with quantize/dequantize ops (run quantweave.convert_pt2e first); "
            "the given graph has no dequantize node"
        )
    example_inputs = tuple(example_inputs)
    program = torch.export.export(converted, example_inputs)
    lowered = LoweredModule(torch.compile(program.module(), backend="inductor"), bf16)
    lowered(*example_inputs)  # compile now, under freezing
    return lowered

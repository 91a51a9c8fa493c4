"""Lower a converted (q/dq) model to real int8 kernels with inductor.

``lower(converted, example_inputs)`` compiles the converted model with inductor and
*freezing* (which lets inductor's x86 passes fold the quantize/dequantize
patterns into oneDNN int8 convolutions and linears) and returns a :class:`LoweredModule`.

- No global side effects: freezing (and autocast for ``bf16=True``) is switched on only
  around the module's own calls; importing this module changes no configuration.
- addmm / mm / matmul of an int8 weight stored [in, out] (GPT-2's ``Conv1D``, ``x @ W``) are
  compiled as the linear of the transposed weight (the same values), which inductor's int8
  linear pass matches (``quantweave.authoring.products_as_linears``).
- ``x + x`` is compiled as ``x * 2`` (the same value): torch 2.13's int8 linear / conv +
  add fusion asserts when both operands of the add are the linear's (conv's) output.
- A quantized conv1d is compiled as the conv2d over a height of 1 (the same values, still an
  int8 conv): torch 2.13's fake kernel of inductor's int8 conv records a conv1d's output length
  as if its kernel were 1, and a later op that checks it (Whisper's ``+ positions``) fails to compile.
- Dynamic qparams (``choose_qparams.tensor``) are compiled as the aten ops of the op's own arithmetic
  (range widened to hold 0): torch 2.13 inductor's decomposition takes an all-positive tensor's own
  [min, max] and the lowered model then differed from the converted one (``_dynamic_qparams``).
- On a CPU without VNNI or AMX (AVX2 / AVX-512 without VNNI), oneDNN multiplies uint8 by
  int8 with 16-bit intermediate sums that saturate on activations in [0, 255]: ``lower``
  warns (``quantweave.MisuseWarning``) naming a full-range quantize and the fix, quantizing
  with ``X86InductorQuantizer(reduce_range=cpu_needs_reduce_range())`` ([0, 127]).
- The caller's input tensors are never mutated. Inductor's int8 binary fusion can write
  the result of ``x + f(x)`` into ``x``'s buffer when ``x`` is a graph input; the module
  hands the compiled code private copies of the inputs that reach any op other than a
  quantize (an input that is only quantized is only read, and is passed as is).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule, Node

from quantweave import MisuseWarning
from quantweave.authoring import copy_for_rewrite, dequantize_ops, finish_rewrite, products_as_linears, quantize_ops

from ._conv1d import quantized_conv1ds_as_conv2ds
from ._dynamic_qparams import choose_qparams_as_aten_ops

__all__ = ["LoweredModule", "cpu_needs_reduce_range", "lower"]

#: CPU flags with single-instruction int8 dot products (no saturating 16-bit sums)
_INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


@functools.cache
def cpu_needs_reduce_range() -> bool:
    """True when this CPU has no VNNI / AMX int8 dot products (``/proc/cpuinfo``): its int8
    kernels sum pairs of uint8 x int8 products in 16 bits, which saturate unless activations
    stay in [0, 127]: quantize with ``X86InductorQuantizer(reduce_range=True)`` there.
    False where the flags cannot be read (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    return flags is not None and not (_INT8_DOT_FLAGS & set(flags))


def _full_range_quantize(converted: GraphModule) -> Node | None:
    """The first uint8 per-tensor quantize of an activation with quant_max above 127."""
    for node in converted.graph.nodes:
        if node.op == "call_function" and node.target in quantize_ops() and len(node.args) >= 6:
            quant_max, dtype = node.args[-2], node.args[-1]
            if dtype == torch.uint8 and isinstance(quant_max, int) and quant_max > 127:
                return node
    return None


class LoweredModule:
    """A compiled quantized model. Call it like the model; inputs are left untouched."""

    def __init__(self, compiled: Any, bf16: bool, protected_inputs: tuple[int, ...] | None) -> None:
        self._compiled = compiled
        self.bf16 = bf16
        #: positions of the inputs passed as private copies (None: all tensor inputs)
        self.protected_inputs = protected_inputs

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
        protect = self.protected_inputs
        private = tuple(
            a.clone() if isinstance(a, torch.Tensor) and (protect is None or i in protect) else a
            for i, a in enumerate(args)
        )
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
    full_range = _full_range_quantize(converted) if cpu_needs_reduce_range() else None
    if full_range is not None:
        warnings.warn(
            f"quantweave_x86.lower: this CPU has no VNNI / AMX int8 instructions and {full_range.name!r} quantizes "
            f"activations to uint8 [0, {full_range.args[-2]}]: its int8 kernels' 16-bit sums can saturate and the "
            "lowered model can differ from the converted one; quantize with "
            "X86InductorQuantizer(reduce_range=quantweave_x86.cpu_needs_reduce_range()) (activations in [0, 127])",
            MisuseWarning,
            stacklevel=2,
        )
    example_inputs = tuple(example_inputs)
    # compiled as is: a re-export added input checks worth ~0.4 ms per call (encoder, b1)
    ready = _int32_weight_zero_points(
        _without_self_adds(quantized_conv1ds_as_conv2ds(products_as_linears(choose_qparams_as_aten_ops(converted))))
    )
    compiled = torch.compile(ready, backend="inductor")
    lowered = LoweredModule(compiled, bf16, _inputs_to_protect(converted, len(example_inputs)))
    lowered(*example_inputs)  # compile now, under freezing
    return lowered


def _without_self_adds(converted: GraphModule) -> GraphModule:
    """``x + x`` written as ``x * 2`` (the same value, exactly), on a new GraphModule that
    shares ``converted``'s tensors: torch 2.13's int8 linear / conv + add fusion pass
    asserts when both operands of the add are the linear's (conv's) output."""
    if not any(_is_self_add(n) for n in converted.graph.nodes):
        return converted
    rewritten, nodes = copy_for_rewrite(converted)
    for node in nodes.values():
        if _is_self_add(node):
            node.target = torch.ops.aten.mul.Tensor
            node.args = (node.args[0], 2.0)
    return finish_rewrite(rewritten)


def _int32_weight_zero_points(model: GraphModule) -> GraphModule:
    """Per-channel zero points stored as int64 constants read as int32 (the same values), on a new
    GraphModule over the same graph that shares ``model``'s other tensors: inductor's oneDNN int8
    linear takes int32 ones and converts an int64 one with ``torch.tensor(tensor)``, warning on
    every ``lower``. Top-level constants only (what convert makes); ``model`` is not changed."""
    dequantize = torch.ops.quantized_decomposed.dequantize_per_channel.default
    targets = {
        str(n.args[2].target)
        for n in model.graph.nodes
        if n.op == "call_function" and n.target == dequantize and isinstance(n.args[2], Node)
        if n.args[2].op == "get_attr" and "." not in str(n.args[2].target)
    }
    values: dict[str, torch.Tensor] = {}
    for target in sorted(targets):
        value = getattr(model, target, None)
        if isinstance(value, torch.Tensor) and value.dtype == torch.int64:
            values[target] = value
    if not values:
        return model
    rewritten = GraphModule(model, model.graph)  # the graph is not changed: shared
    rewritten.meta.update(model.meta)
    for target, value in values.items():
        setattr(rewritten, target, value.to(torch.int32))
    return rewritten


def _is_self_add(node: Node) -> bool:
    return (
        node.op == "call_function"
        and node.target == torch.ops.aten.add.Tensor
        and len(node.args) == 2
        and isinstance(node.args[0], Node)
        and node.args[0] is node.args[1]
        and not node.kwargs
    )


def _inputs_to_protect(converted: GraphModule, n_args: int) -> tuple[int, ...] | None:
    """Positions of the inputs that reach an op other than quantize (or the export guard).

    None (protect every tensor) when the placeholders do not map one to one onto the
    positional arguments (nested or keyword inputs).
    """
    placeholders = [n for n in converted.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != n_args:
        return None
    readers = set(quantize_ops()) | {
        torch.ops.quantized_decomposed.choose_qparams.tensor,
        torch.ops.quantized_decomposed.choose_qparams_symmetric.tensor,
    }

    def only_read(node: Node) -> bool:
        return all(
            (user.op == "call_function" and user.target in readers)
            or (user.op == "call_module" and str(user.target) == "_guards_fn")
            for user in node.users
        )

    return tuple(i for i, node in enumerate(placeholders) if not only_read(node))

"""Lower a converted model to an ExecuTorch program: quantized embeddings become ExecuTorch's
``embedding_byte`` / ``embedding_4bit`` kernels, linears go to XNNPACK.

ExecuTorch (the optional extra ``quantweave-executorch[executorch]``) is imported only when
:func:`to_executorch`, :func:`rewrite_embeddings` or :meth:`ExecuTorchLLMProgram.load` is
called. This package imports no torchao (ExecuTorch 1.5.1 itself imports torchao when
``executorch.exir`` is imported).

What happens to each quantized table (``dequantize -> aten.embedding`` in the converted model):

- uint8 per row with float qparams (quantweave-embedding's 8-bit form): left to ExecuTorch's
  quant fusion (``ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)``), which turns
  it into ``embedding_byte``;
- int8 values in [-8, 7] (4-bit: group-wise ``dequantize_per_channel_group``, or per row, the
  form a table tied to a 4-bit head shares): rewritten here, before export, into
  ``quantized_decomposed.embedding_4bit`` over the values packed two per byte (value + 8, the
  even element in the high nibble: ExecuTorch's layout). ExecuTorch's fusion makes
  ``embedding_4bit`` only from torchao's ``dequantize_affine``; left to it, the group-wise form
  is constant-folded into a float table (measured: a 512 x 128 table stored as 262 KB of
  float32 instead of 40 KB);
- other int8 / uint8 tables (8-bit group-wise, or int8 per row shared with an 8-bit head):
  rewritten into ``embedding_byte`` (ExecuTorch's fusion only matches uint8 per-channel).

Zero points that are all zero are dropped (``None``), as ExecuTorch's own recipes store them.

Scales of a table without zero points that are all float16 values -- what
quantweave-embedding's ``scale_dtype=torch.float16`` produces -- are stored in float16 and read
by the ``.dtype`` variants of the kernels with float32 output: the same outputs, 2 bytes per
scale instead of 4. (A lookup at constant indices -- positions -- keeps float32 scales:
ExecuTorch's constant propagation folds it into a float table, computing the product in float16
in its ``.dtype`` reference.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

from quantweave import authoring
from quantweave.authoring import copy_for_rewrite, finish_rewrite, module_attr
from quantweave_xnnpack import ExecuTorchProgram, import_executorch, is_plumbing, lower_to_edge, op_name

__all__ = [
    "EmbeddingLowering",
    "ExecuTorchLLMProgram",
    "pack_int4",
    "rewrite_embeddings",
    "to_executorch",
    "unpack_int4",
]


def _require(module: str, caller: str) -> Any:
    return import_executorch(module, caller=caller, distribution="quantweave-executorch")


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7], shape ``(rows, columns)`` with an even number of columns ->
    uint8 ``(rows, columns // 2)``: ``value + 8``, two per byte, the even-indexed element in
    the high nibble (the layout of ExecuTorch's ``embedding_4bit``)."""
    if values.dtype != torch.int8 or values.dim() != 2 or values.shape[1] % 2:
        raise ValueError(
            f"pack_int4: expected a 2-D int8 tensor with an even number of columns; got {values.dtype} "
            f"{tuple(values.shape)}"
        )
    if values.numel() and (int(values.min()) < -8 or int(values.max()) > 7):
        raise ValueError(f"pack_int4: values must lie in [-8, 7]; got [{int(values.min())}, {int(values.max())}]")
    shifted = (values.to(torch.int16) + 8).to(torch.uint8)
    return (shifted[:, 0::2] << 4) | shifted[:, 1::2]


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`."""
    high = (packed >> 4).to(torch.int16) - 8
    low = (packed & 0xF).to(torch.int16) - 8
    return torch.stack((high, low), dim=-1).reshape(packed.shape[0], -1).to(torch.int8)


@dataclass(frozen=True)
class EmbeddingLowering:
    """One table rewritten by :func:`rewrite_embeddings`: the embedding node, the ExecuTorch
    op it became, the table's shape, its group size (None: per row), the bytes its values
    take in the program and the dtype its scales are stored in."""

    node: str
    op: str
    shape: tuple[int, ...]
    group_size: int | None
    value_bytes: int
    scale_dtype: torch.dtype = torch.float32


def _new_buffer(gm: GraphModule, prefix: str, value: torch.Tensor) -> str:
    index = 0
    while hasattr(gm, f"{prefix}{index}"):
        index += 1
    gm.register_buffer(f"{prefix}{index}", value)
    return f"{prefix}{index}"


def _half_values(value: torch.Tensor) -> bool:
    """True when every element of ``value`` is exactly a float16 value."""
    value = value.to(torch.float32)
    return bool(torch.isfinite(value).all()) and torch.equal(value.to(torch.float16).to(torch.float32), value)


def _reads_input(node: Any) -> bool:
    """True when ``node`` depends on a placeholder (a model input), so is not constant-folded."""
    seen: set[Node] = set()
    pending = [node] if isinstance(node, Node) else []
    while pending:
        current = pending.pop()
        if current.op == "placeholder":
            return True
        if current not in seen:
            seen.add(current)
            pending.extend(current.all_input_nodes)
    return False


def rewrite_embeddings(converted: GraphModule) -> tuple[GraphModule, tuple[EmbeddingLowering, ...]]:
    """A copy of ``converted`` (from ``quantweave.convert_pt2e``) whose quantized tables are read
    by ExecuTorch's ``embedding_4bit`` / ``embedding_byte`` (see the module docstring), and
    what was rewritten. ``converted`` is not modified. Needs ExecuTorch (the ops are defined
    by ``executorch.exir``)."""
    _require("executorch.exir", "quantweave_executorch.rewrite_embeddings")
    qd = torch.ops.quantized_decomposed
    per_channel, per_group = qd.dequantize_per_channel.default, qd.dequantize_per_channel_group.default
    gm, _ = copy_for_rewrite(converted)  # ``converted`` is never modified; tensors are shared
    graph = gm.graph
    lowered: list[EmbeddingLowering] = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.aten.embedding.default:
            continue
        dq, indices = node.args[0], node.args[1]
        if not isinstance(dq, Node) or dq.op != "call_function" or dq.target not in (per_channel, per_group):
            continue
        stored, scales, zero_points = dq.args[0], dq.args[1], dq.args[2]
        if not isinstance(stored, Node) or stored.op != "get_attr" or not isinstance(scales, Node):
            continue
        values: torch.Tensor = module_attr(gm, str(stored.target))
        group_size: Any
        out_dtype: Any
        if dq.target == per_channel:
            axis, qmin, qmax = dq.args[3], dq.args[4], dq.args[5]
            out_dtype = dq.kwargs.get("out_dtype") or torch.float32
            group_size = None
            if axis != 0:
                continue
        else:
            qmin, qmax, group_size, out_dtype = dq.args[3], dq.args[4], dq.args[6], dq.args[7]
        if values.dim() != 2 or out_dtype != torch.float32 or values.dtype not in (torch.int8, torch.uint8):
            continue
        scale_values = module_attr(gm, str(scales.target)).to(torch.float32)
        zp_values = None if not isinstance(zero_points, Node) else module_attr(gm, str(zero_points.target))
        zp = None if zp_values is None or not zp_values.any() else zp_values.to(torch.float32)
        # ExecuTorch 1.5.1 runs float16 scales only without zero points (its kernels want them in the output dtype,
        # its ahead-of-time checks in the scales' dtype)
        # (a lookup at constant indices, e.g. positions, is folded by ExecuTorch's constant propagation, whose
        # Python reference of the .dtype kernels multiplies in float16: it keeps float32 scales, and no bytes)
        half = zp is None and _half_values(scale_values) and _reads_input(indices)
        if values.dtype == torch.uint8 and group_size is None and not half:
            continue  # uint8 per row with float32 scales: ExecuTorch's quant fusion makes embedding_byte
        scale_dtype = torch.float16 if half else torch.float32
        four_bit = values.dtype == torch.int8 and (qmin, qmax) == (-8, 7) and values.shape[1] % 2 == 0
        weight = pack_int4(values) if four_bit else values
        packet = qd.embedding_4bit if four_bit else qd.embedding_byte
        with graph.inserting_before(node):
            args = [
                graph.get_attr(_new_buffer(gm, "_et_embedding_weight_", weight)),
                graph.get_attr(_new_buffer(gm, "_et_embedding_scales_", scale_values.to(scale_dtype))),
                None
                if zp is None
                else graph.get_attr(_new_buffer(gm, "_et_embedding_zero_points_", zp.to(scale_dtype))),
            ]
            if half:  # float16 scales, float32 rows: the .dtype variant
                fused = graph.call_function(packet.dtype, (*args, qmin, qmax, indices), {"dtype": torch.float32})
            else:
                fused = graph.call_function(packet.default, (*args, qmin, qmax, indices))
        fused.meta = dict(node.meta)
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        for dead in (dq, stored, scales, zero_points):
            if isinstance(dead, Node) and not dead.users:
                graph.erase_node(dead)
                if dead.op == "get_attr" and "." not in str(dead.target) and hasattr(gm, str(dead.target)):
                    delattr(gm, str(dead.target))  # this copy's reference only: the caller's model keeps it
        name = "embedding_4bit" if four_bit else "embedding_byte"
        lowered.append(
            EmbeddingLowering(fused.name, name, tuple(values.shape), group_size, weight.numel(), scale_dtype)
        )
    return finish_rewrite(gm), tuple(lowered)


@dataclass(frozen=True)
class ExecuTorchLLMProgram(ExecuTorchProgram):
    """An ExecuTorch program (``buffer``) and what is in it: ``delegated`` / ``not_delegated``
    as for ``quantweave_xnnpack.ExecuTorchProgram`` (``quantweave_xnnpack.lower_to_edge``
    counts them, before quant fusion), ``kernels``
    the ops the final program runs outside the XNNPACK delegates, and ``embeddings`` the
    tables :func:`rewrite_embeddings` lowered."""

    kernels: Mapping[str, int] = field(default_factory=dict)
    embeddings: tuple[EmbeddingLowering, ...] = ()

    def summary(self) -> str:
        kernels = "\n".join(f"  {op}: {n}" for op, n in sorted(self.kernels.items())) or "  (none)"
        return f"{super().summary()}\nkernels outside delegates (final program):\n{kernels}"

    def load(self) -> Any:
        """Load on the ExecuTorch runtime, with ExecuTorch's quantized kernels registered
        (``executorch.kernels.quantized``: ``embedding_byte`` / ``embedding_4bit``)."""
        _require("executorch.kernels.quantized", "ExecuTorchLLMProgram.load")
        return super().load()


def to_executorch(
    converted: torch.nn.Module,
    example_inputs: Sequence[Any],
    *,
    dynamic_shapes: Any = None,
    partitioner_options: Mapping[str, Any] | None = None,
    compile_config: Any = None,
    rewrite_tables: bool = True,
) -> ExecuTorchLLMProgram:
    """Lower ``converted`` (a ``quantweave.convert_pt2e`` result of the ``"llm"`` or
    ``"vision"`` recipe, or a float model) to an ExecuTorch program: tables rewritten by
    :func:`rewrite_embeddings`, ``torch.export``, ``to_edge_transform_and_lower`` with the
    ``XnnpackPartitioner`` (``partitioner_options``), then ``to_executorch`` with ExecuTorch's
    quant fusion and constant propagation. ``rewrite_tables=False`` leaves every table to
    ExecuTorch's passes (group-wise tables are then folded into float ones). Raises
    ``ExecuTorchNotInstalledError`` saying what to install when ExecuTorch is missing."""
    caller = "quantweave_executorch.to_executorch"
    exir = _require("executorch.exir", caller)
    lowered: tuple[EmbeddingLowering, ...] = ()
    model = converted
    if (
        rewrite_tables
        and isinstance(converted, GraphModule)
        and any(n.target in authoring.dequantize_ops() for n in converted.graph.nodes)
    ):
        model, lowered = rewrite_embeddings(converted)
    edge, delegation = lower_to_edge(
        model,
        example_inputs,
        dynamic_shapes=dynamic_shapes,
        partitioner_options=partitioner_options,
        compile_config=compile_config,
        caller=caller,
    )
    manager = edge.to_executorch(exir.ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True))
    kernels: Counter[str] = Counter(
        op_name(n)
        for n in manager.exported_program().graph.nodes
        if n.op == "call_function" and not is_plumbing(op_name(n))
    )
    return ExecuTorchLLMProgram(
        bytes(manager.buffer),
        delegation.delegated,
        delegation.not_delegated,
        delegation.delegate_count,
        dict(kernels),
        lowered,
    )

"""Read quantization decisions back out of a converted model (for tests and reports)."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node

from .._modules.graph import get_attr_value
from ..convert import DEQUANTIZE_OPS, QUANTIZE_OPS

__all__ = ["qdq_summary", "sqnr", "count_ops"]


def _literal(gm: GraphModule, arg: Any) -> Any:
    if isinstance(arg, Node) and arg.op == "get_attr":
        value = get_attr_value(gm, str(arg.target))
        return tuple(value.flatten().tolist())
    if isinstance(arg, Node):
        return f"<{arg.op}>"
    return arg


def qdq_summary(gm: GraphModule) -> dict[tuple[str, str], tuple[Any, ...]]:
    """``{(consumer, source): (scale, zero_point, *rest)}`` for every dequantize node.

    ``source`` is the name of the quantized tensor's producer, or ``"<constant arg i>"`` for
    a folded constant (weight, bias) used as the consumer's argument ``i``. Two converted
    models with the same decisions have equal summaries.
    """
    out: dict[tuple[str, str], tuple[Any, ...]] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in DEQUANTIZE_OPS:
            continue
        quantized = node.args[0]
        assert isinstance(quantized, Node)
        values = tuple(_literal(gm, a) for a in node.args[1:])
        for user in node.users:
            if quantized.op == "get_attr":
                index = next((i for i, a in enumerate(user.args) if a is node), -1)
                source = f"<constant arg {index}>"
            else:
                producer = quantized.args[0] if quantized.target in QUANTIZE_OPS else quantized
                source = getattr(producer, "name", str(producer))
            out[(user.name, source)] = values
    return out


def count_ops(gm: GraphModule, ops: tuple[Any, ...]) -> int:
    """How many call_function nodes of ``gm`` call one of ``ops``."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in ops)


def sqnr(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB (higher is better)."""
    reference, approximation = reference.detach().float(), approximation.detach().float()
    noise = (reference - approximation).pow(2).mean()
    signal = reference.pow(2).mean()
    if noise == 0:
        return float("inf")
    return float(10 * torch.log10(signal / noise))

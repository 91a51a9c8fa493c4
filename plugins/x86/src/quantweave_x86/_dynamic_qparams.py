"""Dynamic (run-time) qparams compiled with the converted model's own arithmetic.

A dynamically quantized activation is ``choose_qparams.tensor(x, qmin, qmax, eps, dtype)`` ->
``quantize_per_tensor.tensor`` -> ``dequantize_per_tensor.tensor``. The op (what the converted
model runs) widens ``x``'s [min, max] to include 0 before it takes the scale (an affine range always
holds 0 exactly); torch 2.13 inductor's decomposition of the op takes ``x``'s own [min, max]. On a
tensor that is all positive (a softmax, a sigmoid) or all negative the two differ: inductor's scale is
finer, its zero point (clamped to [qmin, qmax]) no longer maps min onto qmin, and its CPU quantize
does not clamp to [qmin, qmax] (only to the dtype's range), so the lowered model dequantizes values
the converted one never produces (the fuzz found 10 dB between them on a softmax -> x * x under
``X86InductorQuantizer(is_dynamic=True)``).

:func:`choose_qparams_as_aten_ops` writes each such node as the aten ops the op itself computes
(``torch.ao.quantization.utils.determine_qparams`` for an affine per-tensor range): the same scale
and zero point, which inductor compiles as they are. The quantize / dequantize nodes are left as
they were (inductor's int8 linear pass still folds them into its kernels).
"""

from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from quantweave.authoring import copy_for_rewrite, finish_rewrite, quantize_ops

__all__ = ["choose_qparams_as_aten_ops"]

aten = torch.ops.aten


def _choose_qparams_nodes(model: GraphModule) -> list[Node]:
    quantize_ops()  # registers torch.ops.quantized_decomposed
    target = torch.ops.quantized_decomposed.choose_qparams.tensor
    return [n for n in model.graph.nodes if n.op == "call_function" and n.target == target]


def choose_qparams_as_aten_ops(model: GraphModule) -> GraphModule:
    """``model`` with each ``choose_qparams.tensor`` written as aten ops computing the same scale
    (float64) and zero point (int64) as the op; ``model`` itself when it has none (it is never
    changed). Only nodes whose outputs are read through ``operator.getitem`` (what convert emits)
    are rewritten."""
    if not _choose_qparams_nodes(model):
        return model
    rewritten, _ = copy_for_rewrite(model)
    graph = rewritten.graph
    for node in _choose_qparams_nodes(rewritten):
        readers = list(node.users)
        if not readers or not all(
            u.op == "call_function" and u.target is operator.getitem and u.args[1] in (0, 1) for u in readers
        ):
            continue
        x, quant_min, quant_max, eps = node.args[:4]
        if not (isinstance(quant_min, int) and isinstance(quant_max, int) and isinstance(eps, float)):
            continue
        with graph.inserting_before(node):
            zero = graph.call_function(aten.zeros.default, ([],), {"dtype": torch.float32})
            low = graph.call_function(aten.minimum.default, (graph.call_function(aten.amin.default, (x,)), zero))
            high = graph.call_function(aten.maximum.default, (graph.call_function(aten.amax.default, (x,)), zero))
            span = graph.call_function(aten.sub.Tensor, (high, low))
            scale = graph.call_function(aten.div.Tensor, (span, float(quant_max - quant_min)))
            scale = graph.call_function(aten.clamp_min.default, (scale, float(eps)))
            steps = graph.call_function(aten.round.default, (graph.call_function(aten.div.Tensor, (low, scale)),))
            steps = graph.call_function(aten._to_copy.default, (steps,), {"dtype": torch.int32})
            zero_point = graph.call_function(aten.rsub.Scalar, (steps, quant_min))
            zero_point = graph.call_function(aten.clamp.default, (zero_point, quant_min, quant_max))
            outputs = (
                graph.call_function(aten._to_copy.default, (scale,), {"dtype": torch.float64}),
                graph.call_function(aten._to_copy.default, (zero_point,), {"dtype": torch.int64}),
            )
        for reader in readers:
            reader.replace_all_uses_with(outputs[0 if reader.args[1] == 0 else 1])
            graph.erase_node(reader)
        graph.erase_node(node)
    return finish_rewrite(rewritten)

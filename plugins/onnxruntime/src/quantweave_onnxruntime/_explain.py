"""Why each op of ONNX Runtime's recipe stayed float (the reasons ``quantweave.annotation_report``
shows)."""

from __future__ import annotations

from torch.fx import GraphModule, Node

from quantweave.plugin_api import SKIP_REASON_KEY, is_annotated, set_skip_reason

from ._ops import _AVERAGING, _BINARY, _CAT, _CLIP, _DYNAMIC_OPS, _MATMUL, _RELU, _SHARED, _SPLIT, _UNARY_OWN, _WEIGHTED


def _explain_dynamic(model: GraphModule) -> None:
    for node in model.graph.nodes:
        if node.op != "call_function" or is_annotated(node) or isinstance(node.meta.get(SKIP_REASON_KEY), str):
            continue
        if node.target in _DYNAMIC_OPS:
            set_skip_reason(node, f"{node.target}: dynamic quantization needs float32 tensor inputs")


def _explain_float(model: GraphModule) -> None:
    """Why each op of the recipe stayed float (read by ``quantweave.annotation_report``); a
    reason an earlier quantizer of a composition recorded is kept."""
    for node in model.graph.nodes:
        if node.op != "call_function" or is_annotated(node) or isinstance(node.meta.get(SKIP_REASON_KEY), str):
            continue
        op = str(node.target).split(".")[1] if str(node.target).count(".") == 2 else str(node.target)
        if node.target in _WEIGHTED:
            reason = f"{op}: its input is not a float32 tensor or its weight is not a graph tensor"
        elif node.target in _BINARY + _MATMUL:
            reason = (
                f"{op}: ORT's recipe quantizes it between two float32 tensors; "
                "an operand is a scalar, a constant or not float32"
            )
        elif node.target in _CAT:
            reason = "cat: not every input is a float32 tensor"
        elif node.target in _UNARY_OWN:
            reason = f"{op}: its input is not a float32 tensor"
        elif node.target in _SHARED + _AVERAGING + _SPLIT:
            reason = f"{op}: its input is not quantized (ORT runs it on int8 data only after a quantized producer)"
        elif node.target in _RELU + _CLIP:
            producer = node.args[0] if node.args and isinstance(node.args[0], Node) else None
            where = f"'{producer.name}'" if producer is not None else "its input"
            reason = (
                f"{op}: folded only into the output range of the conv / linear / add before it, when it is that "
                f"op's only user (ORT drops a relu / clip in front of a QuantizeLinear); {where} is not such an op, "
                "is not quantized, or has other users"
            )
        else:
            continue
        set_skip_reason(node, reason)

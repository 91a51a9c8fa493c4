"""Convs with a string padding, written as the conv with explicit padding they equal."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node

from quantweave.authoring import copy_for_rewrite, finish_rewrite, op_name, tensor_value

from ._ops import PADDING_CONVS

_NAMES = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


def padding_of(node: Node) -> list[int] | None:
    """The explicit padding of the conv that equals ``node`` (a conv with a string padding),
    or None when there is none: ``"same"`` with an odd ``dilation * (kernel - 1)`` pads one
    side more than the other (torch pads the extra element at the end)."""
    given: dict[str, Any] = {**dict(zip(_NAMES, node.args, strict=False)), **node.kwargs}
    val = tensor_value(given.get("weight"))
    if not isinstance(val, torch.Tensor):
        return None
    kernel = list(val.shape[2:])
    padding = given.get("padding", "valid")
    if padding == "valid":
        return [0] * len(kernel)
    if padding != "same":
        return None
    dilation = given.get("dilation", 1)
    dilations = [dilation] * len(kernel) if isinstance(dilation, int) else list(dilation)
    totals = [d * (k - 1) for d, k in zip(dilations, kernel, strict=True)]
    if any(not isinstance(t, int) or t % 2 for t in totals):
        return None
    return [t // 2 for t in totals]


def explicit_padding_convs(model: GraphModule) -> GraphModule:
    """A new GraphModule (sharing ``model``'s tensors) with every conv whose string padding
    has an explicit equal rewritten so; ``model`` itself when there is none."""
    todo = [
        n.name
        for n in model.graph.nodes
        if n.op == "call_function" and n.target in PADDING_CONVS and padding_of(n) is not None
    ]
    if not todo:
        return model
    result, nodes = copy_for_rewrite(model)
    defaults: dict[str, Any] = {"bias": None, "stride": 1, "dilation": 1, "groups": 1}
    for name in todo:
        node = nodes[name]
        given: dict[str, Any] = {**defaults, **dict(zip(_NAMES, node.args, strict=False)), **node.kwargs}
        padding = padding_of(node)
        assert padding is not None
        for key in ("stride", "dilation"):  # the .default overloads take one int per dimension
            if isinstance(given[key], int):
                given[key] = [given[key]] * len(padding)
        given["padding"] = padding
        node.target = PADDING_CONVS[node.target]
        node.args = tuple(given[n] for n in _NAMES)
        node.kwargs = {}
    return finish_rewrite(result)


def why_padding_conv_float(node: Node) -> str:
    op = op_name(node)
    if padding_of(node) is None:
        return (
            f"{op} with padding='same' pads one side more than the other here (dilation * (kernel - 1) is odd): "
            "x86 quantizes a conv whose padding is the same on both sides (inductor would run this one as a float "
            "conv between dequantize and quantize)"
        )
    return (
        f"{op} with a string padding is quantized once X86InductorQuantizer.transform_for_annotation has written "
        "it as the conv with explicit padding it equals (prepare_pt2e calls it); this graph was annotated without it"
    )

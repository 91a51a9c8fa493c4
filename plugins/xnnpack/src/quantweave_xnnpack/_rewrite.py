"""The rewrite before annotation: Python-number operands of float32 add / mul become 0-d
float32 buffers, so they can be observed (:meth:`XNNPACKQuantizer.transform_for_annotation`)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.fx import GraphModule

from ._graph import ADD, MUL, calls, is_float32

__all__ = ["scalars_to_buffers"]


def scalars_to_buffers(model: GraphModule) -> GraphModule:
    def scalar(arg: Any) -> bool:
        return isinstance(arg, (int, float)) and not isinstance(arg, bool)

    todo = [
        n.name for n in model.graph.nodes if calls(n, ADD | MUL) and is_float32(n) and any(scalar(a) for a in n.args)
    ]
    if not todo:
        return model
    graph = copy.deepcopy(model.graph)  # nodes and meta dicts are new; tensors are not copied
    result = GraphModule(model, graph)
    result.meta.update(model.meta)
    by_name = {n.name: n for n in graph.nodes}
    counter = 0
    for name in todo:
        node = by_name[name]
        args = list(node.args)
        for i, arg in enumerate(args):
            if not scalar(arg):
                continue
            while hasattr(result, f"_xnnpack_scalar_{counter}"):
                counter += 1
            attr = f"_xnnpack_scalar_{counter}"
            value = torch.tensor(float(arg), dtype=torch.float32)
            result.register_buffer(attr, value)
            with graph.inserting_before(node):
                constant = graph.get_attr(attr)
            fake_mode = getattr(node.meta.get("val"), "fake_mode", None)
            constant.meta["val"] = fake_mode.from_tensor(value, static_shapes=True) if fake_mode else value
            args[i] = constant
        node.args = tuple(args)
    result.recompile()
    return result

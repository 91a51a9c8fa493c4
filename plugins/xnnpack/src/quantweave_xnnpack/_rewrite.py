"""The rewrite before annotation: Python-number operands of float32 add / mul become 0-d
float32 buffers, so they can be observed (:meth:`XNNPACKQuantizer.transform_for_annotation`)."""

from __future__ import annotations

from typing import Any, TypeGuard

import torch
from torch.fx import GraphModule

from quantweave.authoring import calls, copy_for_rewrite, finish_rewrite, is_float_tensor

from ._graph import ADD, MUL

__all__ = ["scalars_to_buffers"]


def scalars_to_buffers(model: GraphModule) -> GraphModule:
    def scalar(arg: Any) -> TypeGuard[int | float]:
        return isinstance(arg, (int, float)) and not isinstance(arg, bool)

    todo = [
        n.name
        for n in model.graph.nodes
        if calls(n, ADD | MUL) and is_float_tensor(n) and any(scalar(a) for a in n.args)
    ]
    if not todo:
        return model
    # the caller's graph is never touched (prepare's own working copy is rewritten in place); tensors are shared
    result, by_name = copy_for_rewrite(model, reuse_working_copy=True)
    graph = result.graph
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
    return finish_rewrite(result)

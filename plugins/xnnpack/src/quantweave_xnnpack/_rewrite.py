"""The rewrite before annotation: Python-number operands of float32 add / mul become 0-d
float32 buffers, so they can be observed (:meth:`XNNPACKQuantizer.transform_for_annotation`)."""

from __future__ import annotations

from typing import Any, TypeGuard

import torch
from torch.fx import GraphModule

from quantweave.authoring import calls, copy_for_rewrite, finish_rewrite, is_float_tensor

from ._graph import ADD, MUL

__all__ = ["scalars_to_buffers"]

_ADD_MUL = ADD | MUL


def _fake_like(fake_mode: Any, value: torch.Tensor) -> Any:
    """A FakeTensor of ``fake_mode`` with ``value``'s shape, strides, dtype and device, as
    torch.export records for a constant. Made from a meta tensor: ``fake_mode.from_tensor``
    gives the same tensor but describes and memoizes the real one first (about 0.2 ms per
    constant on a graph's fresh fake mode, against 0.02 ms); a torch without the converter's
    ``from_meta_and_device`` (private API) takes that path."""
    make = getattr(getattr(fake_mode, "fake_tensor_converter", None), "from_meta_and_device", None)
    if make is None:
        return fake_mode.from_tensor(value, static_shapes=True)
    meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return make(fake_mode, meta, value.device)


def scalars_to_buffers(model: GraphModule) -> GraphModule:
    def scalar(arg: Any) -> TypeGuard[int | float]:
        return isinstance(arg, (int, float)) and not isinstance(arg, bool)

    todo = [
        n.name
        for n in model.graph.nodes
        if n.op == "call_function" and calls(n, _ADD_MUL) and is_float_tensor(n) and any(scalar(a) for a in n.args)
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
            constant.meta["val"] = _fake_like(fake_mode, value) if fake_mode else value
            args[i] = constant
        node.args = tuple(args)
    return finish_rewrite(result)

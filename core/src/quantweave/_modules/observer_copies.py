"""The observers convert gives data of its own (constants no calibration observed), copied.

Convert observes a weight no calibration reached on a copy of its observer, so the
prepared model's observers stay as they were. Copying *every* observer of the model
(``copy.deepcopy`` of each module, about a quarter of a millisecond apiece) was a visible
part of converting an LLM whose weights are observed at convert (issue 25). Only these need
a copy: the observers convert writes into, and every observer that refers to one of them (a
derived observer's ``sources``, at any depth), so that it reads the copy, and every observer
one of those refers to. They are copied together (one ``deepcopy``), so those references
point at the copies; the others are left shared with the prepared model, as they all are
when no constant needs observing.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["copy_observers"]


def copy_observers(modules: dict[str, torch.nn.Module], written: set[str]) -> dict[str, torch.nn.Module]:
    """Copies of ``modules`` (observer name -> module) for the names in ``written`` and every
    name whose module is linked to one of theirs (refers to it or is referred to by it, at any
    depth and through other observers); the names not copied are left out."""
    ids = {id(module) for module in modules.values()}
    links = {id(module): _reachable(module) & ids for module in modules.values()}
    group = {id(modules[name]) for name in written}
    grown = True
    while grown:  # the linked component of the written observers, links taken both ways
        grown = False
        for module_id, reached in links.items():
            if module_id not in group and (reached & group or any(module_id in links[g] for g in group)):
                group.add(module_id)
                grown = True
    chosen = {name: module for name, module in modules.items() if id(module) in group}
    return copy.deepcopy(chosen, _tensor_copies(chosen.values()))


#: containers whose empty instances (no items, no attributes) ``deepcopy`` copies to an empty
#: instance of the same type (through ``__reduce_ex__`` for OrderedDict and set: most of the cost
#: of copying an observer, whose dozen hook dicts are empty)
_EMPTY_COPIES = (dict, OrderedDict, set, list)


def _tensor_copies(modules: Iterable[torch.nn.Module]) -> dict[int, Any]:
    """A ``deepcopy`` memo giving each empty container attribute of ``modules`` (their hook
    dicts) an empty one of its type, and each plain buffer of ``modules`` (and of their submodules)
    its copy made by ``clone()``: what ``deepcopy`` makes of it, at a fraction of the cost
    (``Tensor.__deepcopy__`` was most of copying an observer). Only buffers a clone copies
    exactly: a plain ``torch.Tensor`` (no subclass, no gradient, no Python attributes, strided,
    not a conjugate / negative view) that owns its whole storage (contiguous, offset 0) and
    shares it with no other buffer; any other is left to ``deepcopy``."""
    modules_list = list(modules)
    buffers: dict[int, torch.Tensor] = {}
    for module in modules_list:
        for submodule in module.modules():
            for tensor in submodule._buffers.values():
                if isinstance(tensor, torch.Tensor):
                    buffers[id(tensor)] = tensor
    owners: dict[tuple[torch.device, int], int] = {}
    for tensor in _reachable_tensors(modules_list):  # any tensor sharing a buffer's storage
        if tensor.numel():  # an empty storage holds nothing to share
            storage = (tensor.device, tensor.untyped_storage().data_ptr())
            owners[storage] = owners.get(storage, 0) + 1
    memo: dict[int, Any] = {}
    for module in modules_list:  # a module's empty hook dicts and sets: new empty ones, as deepcopy makes
        for submodule in module.modules():
            for value in vars(submodule).values():
                if type(value) in _EMPTY_COPIES and not value and not getattr(value, "__dict__", None):
                    memo[id(value)] = type(value)()
    for tensor_id, tensor in buffers.items():
        if (
            type(tensor) is torch.Tensor
            and not tensor.requires_grad
            and tensor.layout == torch.strided
            and not tensor.is_quantized
            and not tensor.is_conj()
            and not tensor.is_neg()
            and not vars(tensor)
            and tensor.storage_offset() == 0
            and tensor.is_contiguous()
            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
            and (not tensor.numel() or owners[(tensor.device, tensor.untyped_storage().data_ptr())] == 1)
        ):
            memo[tensor_id] = tensor.clone()
    return memo


def _reachable(module: torch.nn.Module) -> set[int]:
    """Ids of the non-empty objects reachable from ``module``'s attributes, through containers
    and other modules' attributes (tensors and scalars are not followed)."""
    return {id(value) for value in _walk(vars(module).values()) if not isinstance(value, torch.Tensor)}


def _reachable_tensors(modules: list[torch.nn.Module]) -> list[torch.Tensor]:
    """Every tensor (each object once) reachable from ``modules``' attributes, through
    containers and modules."""
    return [value for value in _walk(vars(module) for module in modules) if isinstance(value, torch.Tensor)]


_LEAVES = (str, bytes, int, float, bool, type(None), torch.dtype, torch.qscheme)


def _walk(roots: Iterable[Any]) -> Iterator[Any]:
    """Each object reachable from ``roots`` once (scalars, strings and empty containers left
    out: they hold no module or tensor), following dicts (keys and values), lists, tuples, sets
    and modules' attributes; tensors are yielded, not followed."""
    seen: set[int] = set()
    pending: list[Any] = list(roots)
    while pending:
        value = pending.pop()
        if (
            isinstance(value, _LEAVES)
            or ((type(value) in _EMPTY_COPIES or type(value) is tuple) and not value)
            or id(value) in seen
        ):
            continue
        seen.add(id(value))
        yield value
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            pending.extend(value)
        elif isinstance(value, torch.nn.Module):
            pending.append(vars(value))

"""What the XNNPACK delegate of ExecuTorch 1.5.1 accepts, checked on the candidate node.

ExecuTorch's ``XnnpackPartitioner`` takes some nodes that its runtime then refuses to
build: the program serializes, and fails only when it is loaded (the whole program, not
just the node). :data:`REFUSALS` lists them, each as a check on the candidate edge node;
:func:`xnnpack_partitioner` makes the partitioner with ExecuTorch's own partitioner
configs (or the ``configs`` the caller gave) extended by these checks, so such a node is
kept out of the delegate and runs on ExecuTorch's portable kernels instead. Nothing else
changes: a config without a refusal is used as it is, and a refused node is still taken
when another config takes it with its own node (a pad absorbed by a convolution).

Only ExecuTorch's partitioner objects are touched; this module imports ExecuTorch only
when :func:`xnnpack_partitioner` is called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["REFUSALS", "Refusal", "refusal_for", "xnnpack_partitioner"]

logger = logging.getLogger("quantweave_xnnpack")


def _name(node: Any) -> str:
    target = getattr(node, "target", None)
    return str(getattr(target, "__name__", None) or target)


def _is_call(node: Any, suffix: str) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and _name(node).endswith(suffix)


def _pad_requantized_on_one_side(node: torch.fx.Node) -> bool:
    """A zero constant pad that reads a dequantized tensor and whose output no quantize
    reads. ExecuTorch 1.5.1's XNNPACK preprocessing (``InsertPadQDQPass``) then quantizes
    the pad's output with its input's parameters, while the input stays a float tensor (the
    dequantize feeding it is an explicit conversion: no quantized op claims it): XNNPACK's
    ``xnn_define_static_constant_pad`` refuses mismatched input and output datatypes
    (``Failed to create StaticConstantPad node ... invalid_parameter``, at load)."""
    source = node.args[0] if node.args else None
    if not _is_call(source, "dequantize_per_tensor.default"):
        return False
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0.0)
    amounts = node.args[1] if len(node.args) > 1 else ()
    if value != 0.0 or not isinstance(amounts, list | tuple) or any(int(a) < 0 for a in amounts):
        return False  # left alone by InsertPadQDQPass: delegated as a float pad, which loads
    return not any(_is_call(user, "quantize_per_tensor.default") for user in node.users)


@dataclass(frozen=True)
class Refusal:
    """A node the XNNPACK runtime refuses although the partitioner takes it: the
    partitioner config's ``target_name`` (``"constant_pad_nd.default"``), the check on the
    candidate node and what the runtime says."""

    target: str
    applies: Callable[[torch.fx.Node], bool]
    reason: str


#: the refusals of ExecuTorch 1.5.1's XNNPACK runtime checked before partitioning
REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "constant_pad_nd.default",
        _pad_requantized_on_one_side,
        "a zero pad of a dequantized tensor whose output is not requantized: XNNPACK would quantize its output "
        "and not its input, and refuse the node at load (StaticConstantPad: invalid_parameter)",
    ),
)


def refusal_for(node: torch.fx.Node, refusals: tuple[Refusal, ...] = REFUSALS) -> Refusal | None:
    """The refusal that keeps ``node`` (an edge-dialect node) out of the delegate, or None."""
    name = _name(node)
    for refusal in refusals:
        if name.endswith(refusal.target) and refusal.applies(node):
            return refusal
    return None


def _guarded(config: type, refusals: tuple[Refusal, ...]) -> type:
    """``config`` (an ExecuTorch partitioner config class) whose ``check_constraints`` also
    applies the refusals for its target; ``config`` itself when none is for its target."""
    target = str(getattr(config, "target_name", ""))
    own = tuple(r for r in refusals if target and target.endswith(r.target))
    if not own:
        return config

    class Guarded(config):
        def check_constraints(self, node: torch.fx.Node, ep: Any) -> bool:
            if not super().check_constraints(node, ep):
                return False
            refusal = refusal_for(node, own)
            if refusal is None:
                return True
            logger.info("XNNPACK partitioner: %s (%s) kept out of the delegate: %s", node.name, target, refusal.reason)
            return False

    # same name, so that ExecuTorch's labels of partitioned nodes (node.meta["xnn_partitioner_config"]) are unchanged
    Guarded.__name__, Guarded.__qualname__ = config.__name__, config.__qualname__
    return Guarded


def xnnpack_partitioner(options: Mapping[str, Any] | None = None, refusals: tuple[Refusal, ...] = REFUSALS) -> Any:
    """``XnnpackPartitioner(**options)`` whose configs (``options["configs"]``, else
    ExecuTorch's ``ALL_PARTITIONER_CONFIGS``) also keep out the nodes of ``refusals``."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    kwargs = dict(options or {})
    configs = kwargs.pop("configs", None) or ALL_PARTITIONER_CONFIGS
    return XnnpackPartitioner(configs=[_guarded(c, refusals) for c in configs], **kwargs)

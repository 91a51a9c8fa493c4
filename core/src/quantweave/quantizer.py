"""The ``Quantizer`` contract: what prepare calls, in order.

``prepare_pt2e`` calls, on a copy of the caller's graph (its own: the hooks may edit it in
place, and ``quantweave.authoring.copy_for_rewrite(model, reuse_working_copy=True)`` lets a
``transform_for_annotation`` rewrite it without a second copy; the caller's module is never
handed to a hook):

1. ``transform_for_annotation(model) -> model`` -- optional rewrites (decompositions...);
2. ``annotate(model)`` -- write ``QuantizationAnnotation`` s into ``node.meta``;
3. ``validate(model)`` -- reject annotations the backend cannot run;
4. ``prepare_obs_or_fq_callback(model, edge_or_node_to_observer)`` -- last look at (and
   chance to tweak) the observers before they are inserted.

``quantization_capabilities()`` declares which patterns the quantizer supports; it is the
hook the plugin system and conformance kit build on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import GraphModule

from .annotation import EdgeOrNode

__all__ = ["Quantizer"]


class Quantizer(ABC):
    """Base class of every quantizer (backend, plugin or user-written).

    ``plugin`` names the plugin that provided the quantizer; :func:`quantweave.get_quantizer`
    sets it, and ``ComposableQuantizer`` carries it into the capabilities it merges.
    """

    plugin: str = ""

    @abstractmethod
    def annotate(self, model: GraphModule) -> GraphModule:
        """Annotate the nodes of ``model.graph`` in place and return ``model``."""

    def validate(self, model: GraphModule) -> None:  # noqa: B027 - optional hook
        """Raise if the annotations on ``model`` cannot be run by this backend."""

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Rewrite ``model`` before annotation (default: unchanged)."""
        return model

    def prepare_obs_or_fq_callback(  # noqa: B027 - optional hook
        self, model: GraphModule, edge_or_node_to_obs_or_fq: dict[EdgeOrNode, torch.nn.Module]
    ) -> None:
        """Called with the observer plan before observers are inserted (default: nothing)."""

    def quantization_capabilities(self) -> Sequence[Any]:
        """The patterns this quantizer declares it supports (default: none declared)."""
        return ()

"""``HostedQuantizer``: a vendor's PT2E quantizer, unmodified, as a quantweave quantizer.

The vendor's object (``.vendor``) does all the work: every hook quantweave's prepare calls
(``transform_for_annotation``, ``annotate``, ``validate``, ``prepare_obs_or_fq_callback``)
is passed to it as is, and its own configuration methods (``set_global``,
``set_module_type``, ...) are reached through the wrapper. The wrapper adds what the
registry and ``ComposableQuantizer`` use: a ``name`` and a ``plugin``. It declares no
capabilities: quantweave derives them by probing (``quantweave.capabilities.derive_capabilities``,
cached per vendor configuration).

The annotations the vendor writes are torchao's classes; quantweave's ``prepare_pt2e``
reads them by their fields and its ``convert_pt2e`` turns the vendor's (torchao) observers
into quantize / dequantize ops.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.fx import GraphModule

from quantweave.plugin_api import Quantizer

__all__ = ["HostedQuantizer"]


class HostedQuantizer(Quantizer):
    """``vendor`` (a torchao-style quantizer object) under the quantweave name ``name``."""

    def __init__(self, vendor: Any, name: str) -> None:
        for hook in ("annotate", "transform_for_annotation", "validate"):
            if not callable(getattr(vendor, hook, None)):
                raise TypeError(
                    f"HostedQuantizer {name!r}: {type(vendor).__name__} has no {hook}() method; expected a PT2E "
                    "quantizer (annotate, transform_for_annotation, validate)"
                )
        self.vendor = vendor
        self.name = name

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        result = self.vendor.transform_for_annotation(model)
        return model if result is None else result

    def annotate(self, model: GraphModule) -> GraphModule:
        result = self.vendor.annotate(model)
        return model if result is None else result

    def validate(self, model: GraphModule) -> None:
        self.vendor.validate(model)

    def prepare_obs_or_fq_callback(
        self, model: GraphModule, edge_or_node_to_obs_or_fq: dict[Any, torch.nn.Module]
    ) -> None:
        callback = getattr(self.vendor, "prepare_obs_or_fq_callback", None)
        if callable(callback):
            callback(model, edge_or_node_to_obs_or_fq)

    def __getattr__(self, name: str) -> Any:
        # the vendor's own configuration API (set_global, set_module_type, ...); called only for
        # names the wrapper does not have
        if name.startswith("_") or name == "vendor":
            raise AttributeError(name)
        if "vendor" not in self.__dict__:
            return _missing(name)
        value = getattr(self.__dict__["vendor"], name)
        if not callable(value):
            return value

        @functools.wraps(value)
        def forward(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            # chained configuration (q.set_global(c).set_module_type(...)) keeps the wrapper
            return self if result is self.__dict__["vendor"] else result

        return forward

    def __repr__(self) -> str:
        return f"HostedQuantizer({self.name!r}, {type(self.vendor).__module__}.{type(self.vendor).__qualname__})"


def _missing(name: str) -> Any:
    raise AttributeError(name)

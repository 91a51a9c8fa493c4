"""quantweave: PT2E quantization on public torch, with composable quantizer plugins.

This module is the users' API (prepare, calibrate, convert, save / load, report, compare,
get_quantizer, compose, fallback, the annotation spec classes, the errors) and only
re-exports. Plugin authors import :mod:`quantweave.plugin_api` (the contract) and
:mod:`quantweave.authoring` (the kit); test authors :mod:`quantweave.testing`. Names that
used to be here for them still resolve, with a DeprecationWarning naming the new home
(``quantweave._modules.surface.MOVED``). The plugin loader (:mod:`quantweave.registry`, which
imports pluggy) is imported on first use of one of its names, so ``import quantweave`` and
``import quantweave.plugin_api`` import no plugin and no plugin manager; :mod:`quantweave.view`
is imported on first use of ``quantweave.view`` too.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._modules.deprecated_module import alias_module
from ._modules.surface import moved
from ._modules.version import __version__ as __version__
from .annotation import (
    DerivedQuantizationSpec,
    EdgeOrNode,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationConfig,
    QuantizationSpec,
    QuantizationSpecBase,
    SharedQuantizationSpec,
)
from .calibration import CalibrationResult, calibrate
from .compose import ComposableQuantizer
from .convert import convert_pt2e
from .errors import (
    AnnotationConflictError,
    AnnotationError,
    CalibrationInputError,
    ConvertError,
    MisuseWarning,
    NonFiniteDataError,
    ObserverNotCalibratedError,
    PluginError,
    PluginWarning,
    SerializationError,
    SharingError,
    UnknownQuantizerError,
)
from .float_fallback import FallbackResult, LeaveFloat, fallback
from .numerics import NumericsReport, compare
from .prepare import prepare_pt2e, prepare_qat_pt2e
from .quantizer import Quantizer
from .report import annotation_report
from .serialize import load, save
from .training import allow_exported_model_train_eval, move_exported_model_to_eval, move_exported_model_to_train

if TYPE_CHECKING:
    from . import view as view
    from .registry import get_quantizer, plugins, quantization_capabilities

alias_module(f"{__name__}.fallback", f"{__name__}.float_fallback", until="0.2")  # the module's old name

_LAZY = {name: "registry" for name in ("get_quantizer", "plugins", "quantization_capabilities")}


def __getattr__(name: str) -> Any:
    if name == "view":  # the module, imported on first use (it imports Model Explorer / matplotlib only when used)
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    return moved(name)


__all__ = [
    # the flow
    "prepare_pt2e",
    "prepare_qat_pt2e",
    "calibrate",
    "CalibrationResult",
    "convert_pt2e",
    "save",
    "load",
    "allow_exported_model_train_eval",
    "move_exported_model_to_eval",
    "move_exported_model_to_train",
    # quantizers: from plugins, composed, or written
    "get_quantizer",
    "plugins",
    "quantization_capabilities",
    "ComposableQuantizer",
    "Quantizer",
    # what to quantize how (the PT2E annotation spec classes)
    "QuantizationAnnotation",
    "QuantizationConfig",
    "QuantizationSpec",
    "QuantizationSpecBase",
    "FixedQParamsQuantizationSpec",
    "SharedQuantizationSpec",
    "DerivedQuantizationSpec",
    "EdgeOrNode",
    # what happened, and what to do about it
    "annotation_report",
    "compare",
    "NumericsReport",
    "fallback",
    "FallbackResult",
    "LeaveFloat",
    "view",
    # errors
    "AnnotationConflictError",
    "AnnotationError",
    "CalibrationInputError",
    "ConvertError",
    "MisuseWarning",
    "NonFiniteDataError",
    "ObserverNotCalibratedError",
    "PluginError",
    "PluginWarning",
    "SerializationError",
    "SharingError",
    "UnknownQuantizerError",
]

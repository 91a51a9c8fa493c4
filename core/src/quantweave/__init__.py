"""quantweave: PT2E quantization on public torch, with composable quantizer plugins.

This module only re-exports. The plugin loader (:mod:`quantweave.registry`, which imports
pluggy) is imported on first use of one of its names, so ``import quantweave`` and
``import quantweave.plugin_api`` import no plugin and no plugin manager.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._modules.deprecated_module import alias_module
from .annotation import (
    ANNOTATED_BY_KEY,
    ANNOTATION_KEY,
    SKIP_REASON_KEY,
    DerivedQuantizationSpec,
    EdgeOrNode,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationConfig,
    QuantizationSpec,
    QuantizationSpecBase,
    SharedQuantizationSpec,
    annotate_input_qspec_map,
    annotate_output_qspec,
    get_bias_qspec,
    get_input_act_qspec,
    get_output_act_qspec,
    get_weight_qspec,
    is_annotated,
    mark_annotated,
    set_skip_reason,
)
from .calibration import CalibrationResult, calibrate
from .capabilities import FLOAT, Capability, Mode, Quant, TensorQuant
from .compose import ComposableQuantizer
from .convert import convert_pt2e, dequantize_ops, quantize_ops
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
from .plugin_api import QuantizerInfo, hookimpl
from .prepare import prepare_pt2e, prepare_qat_pt2e
from .quantizer import Quantizer
from .report import annotation_report
from .serialize import load, save
from .training import allow_exported_model_train_eval, move_exported_model_to_eval, move_exported_model_to_train

if TYPE_CHECKING:
    from .registry import PluginManager, get_quantizer, plugins, quantization_capabilities

__version__ = "0.1.1"

alias_module(f"{__name__}.fallback", f"{__name__}.float_fallback", until="0.3")  # the module's old name

_LAZY = {name: "registry" for name in ("PluginManager", "get_quantizer", "plugins", "quantization_capabilities")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ANNOTATED_BY_KEY",
    "ANNOTATION_KEY",
    "SKIP_REASON_KEY",
    "mark_annotated",
    "set_skip_reason",
    "AnnotationConflictError",
    "AnnotationError",
    "ComposableQuantizer",
    "annotation_report",
    "compare",
    "fallback",
    "FallbackResult",
    "LeaveFloat",
    "NumericsReport",
    "Capability",
    "FLOAT",
    "Mode",
    "Quant",
    "PluginError",
    "PluginManager",
    "PluginWarning",
    "MisuseWarning",
    "CalibrationInputError",
    "NonFiniteDataError",
    "QuantizerInfo",
    "TensorQuant",
    "UnknownQuantizerError",
    "get_quantizer",
    "hookimpl",
    "plugins",
    "quantization_capabilities",
    "ConvertError",
    "DerivedQuantizationSpec",
    "EdgeOrNode",
    "FixedQParamsQuantizationSpec",
    "ObserverNotCalibratedError",
    "QuantizationAnnotation",
    "QuantizationConfig",
    "QuantizationSpec",
    "QuantizationSpecBase",
    "Quantizer",
    "SharedQuantizationSpec",
    "SharingError",
    "annotate_input_qspec_map",
    "annotate_output_qspec",
    "convert_pt2e",
    "dequantize_ops",
    "quantize_ops",
    "get_bias_qspec",
    "get_input_act_qspec",
    "get_output_act_qspec",
    "get_weight_qspec",
    "is_annotated",
    "allow_exported_model_train_eval",
    "move_exported_model_to_eval",
    "move_exported_model_to_train",
    "prepare_pt2e",
    "prepare_qat_pt2e",
    "CalibrationResult",
    "SerializationError",
    "calibrate",
    "load",
    "save",
]

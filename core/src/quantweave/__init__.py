"""quantweave: PT2E quantization on public torch, with composable quantizer plugins."""

from .annotation import (
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
)
from .capabilities import Capability, Mode, TensorQuant
from .compose import AnnotationConflictError, ComposableQuantizer
from .convert import convert_pt2e
from .errors import (
    AnnotationError,
    ConvertError,
    ObserverNotCalibratedError,
    PluginError,
    PluginWarning,
    SharingError,
    UnknownQuantizerError,
)
from .hookspecs import hookimpl
from .prepare import prepare_pt2e, prepare_qat_pt2e
from .quantizer import Quantizer
from .registry import PluginManager, QuantizerInfo, get_quantizer, plugins, quantization_capabilities
from .report import annotation_report
from .training import move_exported_model_to_eval, move_exported_model_to_train

__version__ = "0.1.0"

__all__ = [
    "AnnotationConflictError",
    "AnnotationError",
    "ComposableQuantizer",
    "annotation_report",
    "Capability",
    "Mode",
    "PluginError",
    "PluginManager",
    "PluginWarning",
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
    "get_bias_qspec",
    "get_input_act_qspec",
    "get_output_act_qspec",
    "get_weight_qspec",
    "is_annotated",
    "move_exported_model_to_eval",
    "move_exported_model_to_train",
    "prepare_pt2e",
    "prepare_qat_pt2e",
]

"""ONNX Runtime quantizer: the QDQ recipe of ``onnxruntime.quantization.quantize_static``, on aten ops.

ONNX Runtime turns a quantized ONNX model into int8 kernels by finding *node units*: an op
whose every tensor input comes from a ``DequantizeLinear`` and whose only output goes to a
``QuantizeLinear`` (DQ -> Conv -> Q becomes ``QLinearConv``, DQ -> Gemm -> Q ``QGemm``,
DQ -> Add -> Q ``QLinearAdd``...). The recipe therefore quantizes outputs, not only inputs:

- conv1d / conv2d / conv_transpose2d / linear: input (activation), weight (int8 symmetric,
  per output channel: axis 0, axis 1 for a transposed conv) and output. The bias is int32
  where ``quantize_static`` writes it so (ONNX Conv / ConvTranspose / Gemm: a linear on 2-D
  input): scale = input scale x weight scale (per channel), zero point 0, derived from the
  input's and the weight's observers; a linear on more dimensions (MatMul + Add in ONNX), QAT,
  the dynamic mode and ``int32_bias=False`` keep it float.
  A relu (conv2d: also hardtanh / relu6) that is the op's only user is folded into the
  output's range: the activation's output is quantized, the op's is not (ORT's
  ReluQuantFusion / ClipQuantFusion drop the relu / clip in front of the QuantizeLinear);
- add / mul (and a relu after them) / matmul: both inputs and their own output;
- cat: one range for all its inputs and its output (ORT's Concat shares qparams);
- max_pool2d, flatten, view, reshape, permute, transpose, squeeze, dropout: where their
  input is quantized (by any quantizer), input and output share its qparams (ORT drops the
  DQ / Q pair around them);
- avg_pool2d / adaptive_avg_pool2d: where their input is quantized, their own output.

Activations: uint8 [0, 255] affine (ORT's ``QuantType.QUInt8``) or, with
``activation_dtype="int8"``, int8 [-128, 127] affine (``QuantType.QInt8`` with ORT's default
``ActivationSymmetric=False``: ORT drops a relu / clip before a QuantizeLinear only when the
zero point is the lowest value; ``symmetric_activations=True``: int8 [-127, 127], zero point 0,
as ``ActivationSymmetric=True``, with no activation folded into an output range); calibrated by
MinMaxObserver, what ORT's ``quantize_static`` calibrates with by default (``observer=
"histogram"``: torch's HistogramObserver). Weights: int8 [-127, 127]
symmetric (ORT's restricted symmetric range), per channel unless ``per_channel=False``;
``reduce_range=True``: in [-64, 64] (ORT's ``reduce_range``, for
CPUs without VNNI, whose u8 x s8 kernels saturate with full-range weights).

- sigmoid / softmax: their input and their own output (QLinearSigmoid, QLinearSoftmax);
- split: every output shares its input's qparams (ORT's Split unit needs one range); nearest /
  bilinear upsampling (ONNX Resize) shares its input's qparams too;
- layer norm is left float: ORT 1.32's CPU provider has no int8 LayerNormalization kernel
  (a DQ / Q pair around it would only add work; the next linear quantizes its input anyway).

Modes: post-training static (default); ``is_qat=True``: the same recipe through
fake-quantizers for ``prepare_qat_pt2e``, plus conv2d + batch norm (+ relu / clip), the batch
norm folded by ``convert_pt2e``; ``is_dynamic=True``: ORT's ``quantize_dynamic`` recipe for
transformers, linear and matmul with uint8 activations whose qparams are chosen at run time
(``DynamicQuantizeLinear`` -> ``MatMulInteger``) and float outputs; as ``quantize_dynamic``
(its ``MatMulConstBOnly`` default), a matmul whose second operand is computed (attention's
activation x activation matmuls) stays float unless ``matmul_const_b_only=False``.

Configs (:class:`ORTConfig`: the options above but the mode) by module name, module type and
operator type, resolved like every quantweave quantizer's (``quantweave.authoring.ConfigStages``:
module name > module type > operator type > global); a config of ``None`` leaves what it covers
float and says so (``quantweave.annotation_report``). The op before a relu / clip decides their
unit (a conv in a ``set_module_type(torch.nn.Conv2d, ...)`` keeps its functional relu), unless
the relu lies in a module configured on its own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule

import quantweave as qw
from quantweave import authoring
from quantweave.authoring import ConfigStages, op_matches
from quantweave.plugin_api import Capability, is_annotated, warn_unknown_modules

from ._annotator import _Annotator
from ._capabilities import declared_capabilities
from ._config import ORTConfig, Recipe
from ._explain import _explain_dynamic, _explain_float
from ._ops import _DYNAMIC_OPS, _RECIPE_OPS, _WEIGHTED

__all__ = ["ORTConfig", "ORTQuantizer", "declared_capabilities"]


class ORTQuantizer(qw.Quantizer):
    """ONNX Runtime's QDQ recipe (see the module docstring). Usable as built: the constructor's
    options are the global :class:`ORTConfig`.

    ``activation_dtype``: ``"uint8"`` (default: affine [0, 255]) or ``"int8"`` (affine
    [-128, 127]); ``per_channel``: int8 weights per output channel (default) or per tensor;
    ``observer``: ``"minmax"`` (default, ORT's calibration) or ``"histogram"`` for the activations;
    ``reduce_range``: 7-bit weights, [-64, 64] (CPUs without
    VNNI); ``int32_bias``: int32 conv / gemm biases, as ``quantize_static`` writes them (default);
    ``matmul_const_b_only``: quantize only matmuls whose second operand is a constant (ORT's
    ``MatMulConstBOnly``; None, the default: True in the dynamic mode, as ``quantize_dynamic``,
    False otherwise, as ``quantize_static``).
    ``is_dynamic`` / ``is_qat``: the mode, for every config.

    Per-module configs, as the other plugins' quantizers take them (module name > module type >
    operator type > global; ``None`` leaves what it covers float)::

        quantizer = ORTQuantizer().set_module_name("head", None)
        quantizer.set_module_type(torch.nn.Conv2d, ORTConfig(activation_dtype="int8"))
    """

    name = "onnxruntime"

    def __init__(
        self,
        activation_dtype: str = "uint8",
        per_channel: bool = True,
        observer: str | None = None,
        reduce_range: bool = False,
        is_dynamic: bool = False,
        is_qat: bool = False,
        symmetric_activations: bool = False,
        int32_bias: bool = True,
        matmul_const_b_only: bool | None = None,
    ) -> None:
        for option, value in (("is_dynamic", is_dynamic), ("is_qat", is_qat)):
            if not isinstance(value, bool):
                raise TypeError(f"ORTQuantizer: {option} must be a bool; got {value!r}")
        if is_dynamic and is_qat:
            raise ValueError(
                "ORTQuantizer: is_dynamic and is_qat cannot both be True (ORT's dynamic path is post-training)"
            )
        self.is_dynamic = is_dynamic
        self.is_qat = is_qat
        config = ORTConfig(
            activation_dtype,
            per_channel,
            observer,
            reduce_range,
            symmetric_activations,
            int32_bias,
            matmul_const_b_only,
        )
        self._check_mode("ORTQuantizer", config)
        self.global_config: ORTConfig | None = config
        self.module_name_config: dict[str, ORTConfig | None] = {}
        self.module_type_config: dict[type, ORTConfig | None] = {}
        self.operator_type_config: dict[Any, ORTConfig | None] = {}
        self._recipes: dict[ORTConfig, Recipe] = {}
        recipe = self._recipe(config)
        # the constructor's options, as before per-module configs (read by code written against 0.1)
        self.activation_dtype = config.activation_dtype
        self.per_channel = config.per_channel
        self.observer = config.observer
        self.reduce_range = config.reduce_range
        self.symmetric_activations = config.symmetric_activations
        self.int32_bias = config.int32_bias
        self.matmul_const_b_only = recipe.matmul_const_b_only
        self.act = recipe.act
        self._weights = recipe.weights

    # -- configuration -------------------------------------------------------------------------

    def _check_mode(self, setter: str, config: object) -> None:
        authoring.check_config(setter, config, ORTConfig)
        if self.is_dynamic and isinstance(config, ORTConfig) and config.activation_dtype != "uint8":
            raise ValueError(
                f"{setter}: is_dynamic=True takes activation_dtype='uint8' only (ONNX DynamicQuantizeLinear "
                f"is uint8); got activation_dtype={config.activation_dtype!r}"
            )

    def set_global(self, config: ORTConfig | None) -> ORTQuantizer:
        """The config of every op no module name, module type or operator type config claims
        (None: those stay float)."""
        self._check_mode("set_global", config)
        self.global_config = config
        return self

    def set_module_name(self, module_name: str, config: ORTConfig | None) -> ORTQuantizer:
        """Config for every op traced inside the submodule ``module_name`` (``"head"``,
        ``"blocks.0"``); ``None`` leaves them float."""
        if not isinstance(module_name, str) or not module_name:
            raise ValueError(f"set_module_name: module_name must be a non-empty str; got {module_name!r}")
        self._check_mode("set_module_name", config)
        self.module_name_config[module_name] = config
        return self

    def set_module_type(self, module_type: type[torch.nn.Module], config: ORTConfig | None) -> ORTQuantizer:
        """Config for every op traced inside a submodule of class ``module_type`` (any depth)."""
        if not isinstance(module_type, type):
            raise TypeError(f"set_module_type: expected a module class; got {module_type!r}")
        self._check_mode("set_module_type", config)
        self.module_type_config[module_type] = config
        return self

    def set_operator_type(self, operator_type: Any, config: ORTConfig | None) -> ORTQuantizer:
        """Config for one op of the recipe (``torch.ops.aten.linear.default``, or a packet such
        as ``torch.ops.aten.conv2d`` for all its overloads); with a fused activation, the op
        before it (the conv, linear, add) decides."""
        if not isinstance(operator_type, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            raise TypeError(
                f"set_operator_type: expected an aten op such as torch.ops.aten.linear.default; got {operator_type!r}"
            )
        if not any(op_matches(operator_type, op) for op in _RECIPE_OPS):
            supported = ", ".join(sorted(str(op) for op in _RECIPE_OPS))
            raise ValueError(
                f"set_operator_type: {operator_type} is not an op of ONNX Runtime's recipe; supported: {supported}"
            )
        self._check_mode("set_operator_type", config)
        self.operator_type_config[operator_type] = config
        return self

    def _stages(self) -> ConfigStages:
        stages = ConfigStages(self.global_config, config_type=ORTConfig)
        stages.module_name.update(self.module_name_config)
        stages.module_type.update(self.module_type_config)
        stages.operator_type.update(self.operator_type_config)
        return stages

    def _recipe(self, config: ORTConfig) -> Recipe:
        recipe = self._recipes.get(config)
        if recipe is None:
            recipe = self._recipes[config] = Recipe(config, is_dynamic=self.is_dynamic, is_qat=self.is_qat)
        return recipe

    # -- declarations --------------------------------------------------------------------------

    def quantization_capabilities(self) -> tuple[Capability, ...]:
        config = self.global_config
        if config is None:
            return ()
        return declared_capabilities(
            activation_dtype=config.activation_dtype,
            per_channel=config.per_channel,
            reduce_range=config.reduce_range,
            is_dynamic=self.is_dynamic,
            is_qat=self.is_qat,
            symmetric_activations=config.symmetric_activations,
            int32_bias=config.int32_bias,
            matmul_const_b_only=config.matmul_const_b_only,
        )

    def __repr__(self) -> str:
        config = self.global_config
        if config is None:
            text = "ORTQuantizer(global=None"
        else:
            text = (
                f"ORTQuantizer(activation_dtype={config.activation_dtype!r}, per_channel={config.per_channel}, "
                f"observer={config.observer!r}, reduce_range={config.reduce_range}, "
                f"symmetric_activations={config.symmetric_activations}, int32_bias={config.int32_bias}"
            )
            if config.matmul_const_b_only is not None:
                text += f", matmul_const_b_only={config.matmul_const_b_only}"
        text += f", is_dynamic={self.is_dynamic}, is_qat={self.is_qat}"
        for label, held in (
            ("module_name", self.module_name_config),
            ("module_type", {getattr(t, "__name__", str(t)): c for t, c in self.module_type_config.items()}),
            ("operator_type", {str(op): c for op, c in self.operator_type_config.items()}),
        ):
            if held:
                text += f", {label}={held!r}"
        return text + ")"

    # -- annotation --------------------------------------------------------------------------------

    def annotate(self, model: GraphModule) -> GraphModule:
        warn_unknown_modules(model, "set_module_name", self.module_name_config, quantizer=self.name)
        warn_unknown_modules(model, "set_module_type", self.module_type_config, quantizer=self.name)
        stages = self._stages()
        ops = _DYNAMIC_OPS if self.is_dynamic else _RECIPE_OPS
        # one pass in graph order (topological): a producer is annotated before the ops that
        # share its qparams, whichever config covers each
        annotator = _Annotator(stages, self._recipe)
        if self.is_qat:
            for node in list(model.graph.nodes):
                if node.op == "call_function" and node.target in _WEIGHTED and not is_annotated(node):
                    recipe = annotator.recipe_for(node)
                    if recipe is not None:
                        annotator.conv_bn(node, recipe)
        for node in list(model.graph.nodes):
            if node.op != "call_function" or node.target not in ops or is_annotated(node):
                continue
            recipe = annotator.recipe_for(node)
            if recipe is None:
                continue
            if self.is_dynamic:
                annotator.dynamic(node, recipe)
            else:
                annotator.static(node, recipe)
        if self.is_dynamic:
            _explain_dynamic(model)
        else:
            _explain_float(model)
        return model

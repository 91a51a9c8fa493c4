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
as ``ActivationSymmetric=True``, with no activation folded into an output range); HistogramObserver (``observer=
"minmax"``: MinMaxObserver, what ORT calibrates with by default; the default with symmetric
activations, where torch's HistogramObserver, which searches an affine range, loses about
1 dB). Weights: int8 [-127, 127]
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
(``DynamicQuantizeLinear`` -> ``MatMulInteger``) and float outputs.

Configs (:class:`ORTConfig`: the options above but the mode) by module name, module type and
operator type, resolved like every quantweave quantizer's (``quantweave.authoring.ConfigStages``:
module name > module type > operator type > global); a config of ``None`` leaves what it covers
float and says so (``quantweave.annotation_report``). The op before a relu / clip decides their
unit (a conv in a ``set_module_type(torch.nn.Conv2d, ...)`` keeps its functional relu), unless
the relu lies in a module configured on its own.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave import authoring, plugin_api
from quantweave.authoring import ConfigStage, ConfigStages, calls, is_float_tensor, only_user, op_matches
from quantweave.plugin_api import (
    SKIP_REASON_KEY,
    Capability,
    is_annotated,
    mark_annotated,
    set_skip_reason,
    warn_unknown_modules,
)

from ._capabilities import declared_capabilities
from ._config import ORTConfig, Recipe

__all__ = ["ORTConfig", "ORTQuantizer", "declared_capabilities"]

aten = torch.ops.aten

_RELU = (aten.relu.default, aten.relu_.default)
_CLIP = (aten.hardtanh.default, aten.hardtanh_.default, aten.relu6.default)
#: weighted op -> the activations folded into its output range
_WEIGHTED: dict[Any, tuple[Any, ...]] = {
    aten.conv1d.default: _RELU,
    aten.conv2d.default: _RELU + _CLIP,
    aten.conv_transpose2d.input: _RELU,
    aten.linear.default: _RELU,
    # padding="same" / "valid": the same convolution (ONNX Conv takes the padding either way)
    aten.conv1d.padding: _RELU,
    aten.conv2d.padding: _RELU + _CLIP,
}
_TRANSPOSED = (aten.conv_transpose2d.input,)
_BINARY = (aten.add.Tensor, aten.mul.Tensor)
_MATMUL = (aten.matmul.default,)
_CAT = (aten.cat.default,)
_SHARED = (
    aten.max_pool2d.default,
    aten.flatten.using_ints,
    aten.view.default,
    aten.reshape.default,
    aten.permute.default,
    aten.transpose.int,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.dropout.default,
    aten.upsample_nearest2d.vec,
    aten.upsample_bilinear2d.vec,
)
_SPLIT = (aten.split.Tensor,)
_UNARY_OWN = (aten.sigmoid.default, aten.softmax.int)
_BATCH_NORM = aten.batch_norm.default
_AVERAGING = (aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default)
#: every op of the recipe (what a config of None claims and leaves float)
_RECIPE_OPS = frozenset(
    (*_WEIGHTED, *_BINARY, *_MATMUL, *_CAT, *_SHARED, *_SPLIT, *_UNARY_OWN, *_AVERAGING, _BATCH_NORM)
)
_DYNAMIC_OPS = frozenset((aten.linear.default, *_MATMUL))


def _is_float32(arg: Any) -> bool:
    return is_float_tensor(arg)


def _has_output_qparams(node: Node) -> bool:
    annotation = node.meta.get(plugin_api.ANNOTATION_KEY)
    return annotation is not None and getattr(annotation, "output_qspec", None) is not None


def _split_source(arg: Any) -> Node | None:
    """For ``getitem(split(x), i)`` where this recipe quantized the split: ``x``."""
    if not (isinstance(arg, Node) and arg.op == "call_function" and arg.target is operator.getitem):
        return None
    split = arg.args[0]
    if not (isinstance(split, Node) and split.target in _SPLIT and is_annotated(split)):
        return None
    annotation = split.meta.get(plugin_api.ANNOTATION_KEY)
    source = split.args[0]
    if annotation is None or not isinstance(source, Node) or source not in annotation.input_qspec_map:
        return None
    return source


def _only_user(node: Node, targets: tuple[Any, ...]) -> Node | None:
    user = only_user(node)
    if user is not None and calls(user, targets) and user.args and user.args[0] is node:
        return user
    return None


class ORTQuantizer(qw.Quantizer):
    """ONNX Runtime's QDQ recipe (see the module docstring). Usable as built: the constructor's
    options are the global :class:`ORTConfig`.

    ``activation_dtype``: ``"uint8"`` (default: affine [0, 255]) or ``"int8"`` (affine
    [-128, 127]); ``per_channel``: int8 weights per output channel (default) or per tensor;
    ``observer``: ``"histogram"`` or ``"minmax"`` for the activations (default: histogram, MinMax
    with ``symmetric_activations``); ``reduce_range``: 7-bit weights, [-64, 64] (CPUs without
    VNNI); ``int32_bias``: int32 conv / gemm biases, as ``quantize_static`` writes them (default).
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
        config = ORTConfig(activation_dtype, per_channel, observer, reduce_range, symmetric_activations, int32_bias)
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


class _Annotator:
    """Annotates one graph: each op with the recipe of the config that covers it."""

    def __init__(self, stages: ConfigStages, recipe: Any) -> None:
        self.stages = stages
        self._make_recipe = recipe
        self._covering: dict[Node, ConfigStage] = {}

    def covering(self, node: Node) -> ConfigStage:
        stage = self._covering.get(node)
        if stage is None:
            stage = self._covering[node] = self.stages.covering(node)
        return stage

    def recipe_for(self, node: Node) -> Recipe | None:
        """The recipe covering ``node``; None when its config is None (a config of None set by
        module name, module type or operator type claims the node and says why; a global
        config of None leaves it to other quantizers)."""
        stage = self.covering(node)
        if stage.config is None:
            if stage.kind != "global":
                mark_annotated(node)
                set_skip_reason(node, f"{stage.description} is configured None")
            return None
        recipe: Recipe = self._make_recipe(stage.config)
        return recipe

    def joins(self, node: Node, follower: Node) -> bool:
        """Whether ``follower`` (an activation after ``node``) may be folded into ``node``'s
        unit: ``node``'s config decides the unit (as the other plugins' anchors do), unless the
        follower lies in a module with a config of its own (then it is that module's)."""
        mine, theirs = self.covering(node), self.covering(follower)
        if theirs.kind in ("module_name", "module_type"):
            return (mine.kind, mine.key) == (theirs.kind, theirs.key)
        return True

    def folded(self, node: Node, targets: tuple[Any, ...], recipe: Recipe) -> Node | None:
        """The activation folded into ``node``'s output range, if any."""
        if not recipe.fold_activations:
            return None
        activation = _only_user(node, targets)
        if activation is None or is_annotated(activation) or not self.joins(node, activation):
            return None
        return activation

    # -- static / QAT ----------------------------------------------------------------------------

    def static(self, node: Node, recipe: Recipe) -> None:
        target = node.target
        if target in _WEIGHTED:
            self.weighted(node, recipe)
        elif target in _BINARY:
            self.two_inputs(node, self.folded(node, _RELU, recipe) or node, recipe)
        elif target in _MATMUL:
            self.two_inputs(node, node, recipe)
        elif target in _CAT:
            self.cat(node, recipe)
        elif target in _SHARED:
            self.shared(node)
        elif target in _AVERAGING:
            self.averaging(node, recipe)
        elif target in _UNARY_OWN:
            self.unary_own(node, recipe)
        elif target in _SPLIT:
            self.split(node)

    def conv_bn(self, conv: Node, recipe: Recipe) -> None:
        """QAT: conv2d -> batch norm (-> relu / clip): conv's input and weight, the last op's output."""
        if conv.target not in (aten.conv2d.default, aten.conv2d.padding):
            return
        bn = _only_user(conv, (_BATCH_NORM,))
        x, weight = conv.args[0], conv.args[1] if len(conv.args) > 1 else None
        if bn is None or is_annotated(bn) or not _is_float32(x) or not isinstance(weight, Node):
            return
        assert isinstance(x, Node)
        activation = self.folded(bn, _WEIGHTED[conv.target], recipe)
        authoring.annotate_input_qspec_map(conv, x, _input_spec(x, recipe))
        authoring.annotate_input_qspec_map(conv, weight, recipe.weights[0])
        last = activation or bn
        authoring.annotate_output_qspec(last, recipe.act)
        mark_annotated([conv, bn] + ([activation] if activation is not None else []))

    def weighted(self, node: Node, recipe: Recipe) -> None:
        x = node.args[0]
        weight = node.args[1] if len(node.args) > 1 else None
        if not _is_float32(x) or not isinstance(weight, Node):
            return
        assert isinstance(x, Node)
        activation = self.folded(node, _WEIGHTED[node.target], recipe)
        axis = 1 if node.target in _TRANSPOSED else 0
        authoring.annotate_input_qspec_map(node, x, _input_spec(x, recipe))
        authoring.annotate_input_qspec_map(node, weight, recipe.weights[axis])
        bias = node.args[2] if len(node.args) > 2 else None
        if recipe.int32_bias and isinstance(bias, Node) and _int32_bias_fits(node, x):
            authoring.annotate_input_qspec_map(node, bias, recipe.bias_spec(node, x, weight))
        if activation is None:
            authoring.annotate_output_qspec(node, recipe.act)
            mark_annotated(node)
        else:
            authoring.annotate_output_qspec(activation, recipe.act)
            mark_annotated([node, activation])

    def two_inputs(self, node: Node, last: Node, recipe: Recipe) -> None:
        if len(node.args) < 2 or not all(_is_float32(a) for a in node.args[:2]):
            return
        for arg in node.args[:2]:
            assert isinstance(arg, Node)
            authoring.annotate_input_qspec_map(node, arg, _input_spec(arg, recipe))
        authoring.annotate_output_qspec(last, recipe.act)
        mark_annotated([node] if last is node else [node, last])

    def cat(self, node: Node, recipe: Recipe) -> None:
        tensors = node.args[0] if node.args else None
        if not isinstance(tensors, (list, tuple)) or not tensors or not all(_is_float32(t) for t in tensors):
            return
        inputs: list[Node] = list(tensors)
        # one range for every input and the output, owned by the first quantized input
        owner = next((i for i in inputs if _has_output_qparams(i)), inputs[0])
        authoring.share_inputs(node, inputs, owner, recipe.act)
        mark_annotated(node)

    def shared(self, node: Node) -> None:
        x = _quantized_input(node)
        if x is None:
            return
        shared = qw.SharedQuantizationSpec(x)
        authoring.annotate_input_qspec_map(node, x, shared)
        authoring.annotate_output_qspec(node, shared)
        mark_annotated(node)

    def averaging(self, node: Node, recipe: Recipe) -> None:
        x = _quantized_input(node)
        if x is None:
            return
        authoring.annotate_input_qspec_map(node, x, qw.SharedQuantizationSpec(x))
        authoring.annotate_output_qspec(node, recipe.act)
        mark_annotated(node)

    def unary_own(self, node: Node, recipe: Recipe) -> None:
        x = node.args[0] if node.args else None
        if not _is_float32(x):
            return
        assert isinstance(x, Node)
        authoring.annotate_input_qspec_map(node, x, _input_spec(x, recipe))
        authoring.annotate_output_qspec(node, recipe.act)
        mark_annotated(node)

    def split(self, node: Node) -> None:
        """The input shares its producer's range; the outputs (getitem nodes) stay float here
        and every quantized consumer quantizes them with that same range (:func:`_input_spec`),
        so ORT sees DQ -> Split -> Q with one range on every side."""
        x = _quantized_input(node)
        if x is None:
            return
        authoring.annotate_input_qspec_map(node, x, qw.SharedQuantizationSpec(x))
        mark_annotated(node)

    # -- dynamic ---------------------------------------------------------------------------------

    def dynamic(self, node: Node, recipe: Recipe) -> None:
        """linear: dynamic input, int8 weight; matmul: both inputs dynamic; outputs float."""
        if node.target == aten.linear.default:
            x, weight = node.args[0], node.args[1] if len(node.args) > 1 else None
            if not _is_float32(x) or not isinstance(weight, Node):
                return
            assert isinstance(x, Node)
            authoring.annotate_input_qspec_map(node, x, recipe.act)
            authoring.annotate_input_qspec_map(node, weight, recipe.weights[0])
            mark_annotated(node)
        elif node.target in _MATMUL:
            if len(node.args) < 2 or not all(_is_float32(a) for a in node.args[:2]):
                return
            for arg in node.args[:2]:
                assert isinstance(arg, Node)
                authoring.annotate_input_qspec_map(node, arg, recipe.act)
            mark_annotated(node)


def _int32_bias_fits(node: Node, x: Node) -> bool:
    """Where ORT's quantize_static writes an int32 bias: ONNX Conv / ConvTranspose (groups 1:
    its weight channels are its output channels) and Gemm (a linear on 2-D input; on more
    dimensions the exporter writes MatMul + Add, whose bias ORT leaves float)."""
    if node.target == aten.linear.default:
        value = x.meta.get("val")
        return isinstance(value, torch.Tensor) and value.dim() == 2
    if node.target in _TRANSPOSED:
        groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
        return bool(groups == 1)
    return True


def _input_spec(arg: Node, recipe: Recipe) -> Any:
    """The spec of an activation input: a split output (getitem of a split this recipe
    quantized) shares the split input's range; anything else gets its own."""
    source = _split_source(arg)
    return recipe.act if source is None else qw.SharedQuantizationSpec(source)


def _quantized_input(node: Node) -> Node | None:
    """The node whose quantized output ``node`` reads (a split output: the split's input)."""
    x = node.args[0] if node.args else None
    if isinstance(x, Node) and _is_float32(x) and _has_output_qparams(x):
        return x
    return _split_source(x) if isinstance(x, Node) else None


def _explain_dynamic(model: GraphModule) -> None:
    for node in model.graph.nodes:
        if node.op != "call_function" or is_annotated(node) or isinstance(node.meta.get(SKIP_REASON_KEY), str):
            continue
        if node.target in _DYNAMIC_OPS:
            set_skip_reason(node, f"{node.target}: dynamic quantization needs float32 tensor inputs")


def _explain_float(model: GraphModule) -> None:
    """Why each op of the recipe stayed float (read by ``quantweave.annotation_report``); a
    reason an earlier quantizer of a composition recorded is kept."""
    for node in model.graph.nodes:
        if node.op != "call_function" or is_annotated(node) or isinstance(node.meta.get(SKIP_REASON_KEY), str):
            continue
        op = str(node.target).split(".")[1] if str(node.target).count(".") == 2 else str(node.target)
        if node.target in _WEIGHTED:
            reason = f"{op}: its input is not a float32 tensor or its weight is not a graph tensor"
        elif node.target in _BINARY + _MATMUL:
            reason = (
                f"{op}: ORT's recipe quantizes it between two float32 tensors; "
                "an operand is a scalar, a constant or not float32"
            )
        elif node.target in _CAT:
            reason = "cat: not every input is a float32 tensor"
        elif node.target in _UNARY_OWN:
            reason = f"{op}: its input is not a float32 tensor"
        elif node.target in _SHARED + _AVERAGING + _SPLIT:
            reason = f"{op}: its input is not quantized (ORT runs it on int8 data only after a quantized producer)"
        elif node.target in _RELU + _CLIP:
            producer = node.args[0] if node.args and isinstance(node.args[0], Node) else None
            where = f"'{producer.name}'" if producer is not None else "its input"
            reason = (
                f"{op}: folded only into the output range of the conv / linear / add before it, when it is that "
                f"op's only user (ORT drops a relu / clip in front of a QuantizeLinear); {where} is not such an op, "
                "is not quantized, or has other users"
            )
        else:
            continue
        set_skip_reason(node, reason)

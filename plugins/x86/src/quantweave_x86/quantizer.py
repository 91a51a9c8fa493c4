"""X86 Inductor quantizer: the PT2E x86 recipe, matched on aten ops.

The recipe (same semantics as the PT2E/torchao X86InductorQuantizer, so inductor's x86 int8
passes lower the result):

- conv / linear *inputs* are quantized (uint8 per-tensor affine activations, int8
  per-channel symmetric weights); their outputs are not — the next quantized op quantizes
  its own input. Fusion patterns mark their last node as "output of a quantized pattern":
  conv2d + add (+ relu), conv2d / conv1d + unary, linear + add (+ relu), linear + unary;
- conv2d + add: the add's other input is quantized too; linear + add: it is not;
- mul of two same-shape tensors: both inputs quantized;
- max_pool2d, cat, avg_pool2d, adaptive_avg_pool2d, flatten: quantized only when their
  inputs come from quantized patterns; their outputs then share their input's observer;
- addmm / mm / matmul of an activation and a constant weight stored [in, out] (GPT-2's
  ``Conv1D``, ``x @ W + b``): a linear, the weight per channel on its output axis (1);
- matmul of two activations: opt-in (``enable_matmul=True`` or
  ``set_function_type_qconfig(torch.matmul, ...)``);
- QAT (``is_qat=True``): conv2d + batch norm, alone or followed by add (+ relu) or by one of
  the conv activations, is annotated first as one pattern whose last node fake-quantizes
  its output (batch norm stays in the graph while training); ``prepare_qat_pt2e`` and
  ``convert_pt2e`` simulate and then fold the batch norm.

Unlike the peer, patterns are found on the exported aten graph itself (not through source
partitions), so they are found under default non-strict ``torch.export``, with functional
or module activations; standalone conv1d is quantized too. Configs are applied module name
> operator type > global; ``None`` leaves the matched nodes float and records why in
``node.meta[quantweave.plugin_api.SKIP_REASON_KEY]`` (through ``set_skip_reason``).

A conv with a string padding (``padding="valid"``, or ``"same"`` padding both sides alike:
``dilation * (kernel - 1)`` even) is quantized as the conv with explicit padding it equals:
``transform_for_annotation`` rewrites it so (on a new GraphModule), and inductor lowers it
to the same int8 conv. ``"same"`` that pads one side more (an even kernel) stays float,
with a reason: inductor would run it as a float conv between dequantize and quantize.

Every node whose op is in one of x86's patterns and that x86 leaves float gets a reason
too (``set_skip_reason``), read by ``quantweave.annotation_report``: the rule that did not
apply here (pooling whose input is not quantized by an x86 pattern, an activation that
does not follow a conv / linear it can fuse with, a flatten with no quantized consumer, a
mul of differently shaped tensors, matmul not enabled, no config covering the node, an
in-place add / mul...). In-place ops count as their functional op
(``quantweave.capabilities.vocabulary_op``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.authoring import ConfigStage, ConfigStages, in_place_reason, op_name, weight_matmul
from quantweave.plugin_api import Capability, Mode, warn_unknown_modules

from ._annotate import StageAnnotator, X86Annotation, share_outputs_of_int8_in_int8_out
from ._capabilities import TABLE, declared_capabilities
from ._config import describe_config, get_default_x86_inductor_quantization_config, is_dynamic
from ._ops import DEFAULT_QUANTIZABLE, MATMUL, OPERATOR_OF, PADDING_CONVS, QUANTIZABLE
from ._padding import explicit_padding_convs, why_padding_conv_float

__all__ = [
    "X86Annotation",
    "X86InductorQuantizer",
    "declared_capabilities",
    "get_default_x86_inductor_quantization_config",
]

_NO_CONFIG = "no x86 config covers it (the global config is None, no module name or operator config matches)"


class X86InductorQuantizer(qw.Quantizer):
    """x86 recipe for inductor. Usable as built: the global config is the default recipe.

    ``is_dynamic``: dynamic activations (choose_qparams at run time);
    ``reduce_range``: activations in [0, 127] (CPUs without VNNI);
    ``enable_matmul``: also quantize activation x activation matmuls;
    ``is_qat``: fake-quantize for ``prepare_qat_pt2e`` (conv + batch norm patterns are
    annotated whole; ``convert_pt2e`` folds the batch norm).
    """

    name = "x86"

    def __init__(
        self, is_dynamic: bool = False, reduce_range: bool = False, enable_matmul: bool = False, is_qat: bool = False
    ) -> None:
        for option, value in (
            ("is_dynamic", is_dynamic),
            ("is_qat", is_qat),
            ("reduce_range", reduce_range),
            ("enable_matmul", enable_matmul),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"X86InductorQuantizer: {option} must be a bool; got {value!r}")
        self.enable_matmul = enable_matmul
        self.reduce_range = reduce_range
        self.global_config: qw.QuantizationConfig | None = get_default_x86_inductor_quantization_config(
            is_qat=is_qat, is_dynamic=is_dynamic, reduce_range=reduce_range
        )
        self.operator_type_qconfig: dict[Any, qw.QuantizationConfig | None] = {}
        self.module_name_qconfig: dict[str, qw.QuantizationConfig | None] = {}

    # -- configuration ---------------------------------------------------------------------------

    def _check_mode(self, setter: str, config: qw.QuantizationConfig | None, replacing: object = None) -> None:
        if config is None:
            return
        if not isinstance(config, qw.QuantizationConfig):
            raise TypeError(f"{setter}: expected a quantweave.QuantizationConfig or None; got {type(config).__name__}")
        others: list[tuple[str, qw.QuantizationConfig]] = []
        if self.global_config is not None and replacing != "global":
            others.append(("set_global", self.global_config))
        others += [(f"set_module_name_qconfig({n!r})", c) for n, c in self.module_name_qconfig.items() if c is not None]
        others += [(f"operator {op}", c) for op, c in self.operator_type_qconfig.items() if c is not None]
        for where, other in others:
            if where == replacing:
                continue
            if other.is_qat != config.is_qat:
                raise ValueError(
                    f"{setter}: mixing QAT and post-training configs is not supported; this config has "
                    f"is_qat={config.is_qat}, {where} has is_qat={other.is_qat}"
                )
            mine, theirs = is_dynamic(config), is_dynamic(other)
            if mine is not None and theirs is not None and mine != theirs:
                raise ValueError(
                    f"{setter}: mixing static and dynamic configs is not supported; this config has "
                    f"is_dynamic={mine}, {where} has is_dynamic={theirs}"
                )

    def set_global(self, quantization_config: qw.QuantizationConfig | None) -> X86InductorQuantizer:
        """The config for everything not matched by a module name or operator type config."""
        self._check_mode("set_global", quantization_config, replacing="global")
        self.global_config = quantization_config
        return self

    def get_global_quantization_config(self) -> qw.QuantizationConfig | None:
        return self.global_config

    def set_function_type_qconfig(
        self, function_type: Callable[..., Any], quantization_config: qw.QuantizationConfig | None
    ) -> X86InductorQuantizer:
        """Config for one operator, named by a torch function (``torch.matmul``, ``F.linear``...)."""
        return self._set_operator("set_function_type_qconfig", function_type, quantization_config)

    def set_module_type_qconfig(
        self, module_type: type[torch.nn.Module], quantization_config: qw.QuantizationConfig | None
    ) -> X86InductorQuantizer:
        """Config for one operator, named by its module type (``torch.nn.Linear``...)."""
        return self._set_operator("set_module_type_qconfig", module_type, quantization_config)

    def _set_operator(self, setter: str, key: Any, config: qw.QuantizationConfig | None) -> X86InductorQuantizer:
        op = OPERATOR_OF.get(key)
        if op is None:
            supported = ", ".join(sorted({getattr(k, "__name__", str(k)) for k in OPERATOR_OF}))
            raise ValueError(f"{setter}: {key!r} is not an operator the x86 quantizer handles; supported: {supported}")
        self._check_mode(setter, config, replacing=f"operator {op}")
        self.operator_type_qconfig[op] = config
        return self

    def set_module_name_qconfig(
        self, module_name: str, quantization_config: qw.QuantizationConfig | None
    ) -> X86InductorQuantizer:
        """Config for every supported pattern inside the submodule ``module_name`` (e.g. ``"layers.0"``)."""
        if not isinstance(module_name, str) or not module_name:
            raise ValueError(f"set_module_name_qconfig: module_name must be a non-empty str; got {module_name!r}")
        self._check_mode(
            "set_module_name_qconfig", quantization_config, replacing=f"set_module_name_qconfig({module_name!r})"
        )
        self.module_name_qconfig[module_name] = quantization_config
        return self

    def _configs(self) -> ConfigStages:
        """The configs, resolved module name > operator type > global (the kit's rule)."""
        stages = ConfigStages(self.global_config)
        stages.module_name.update(self.module_name_qconfig)
        stages.operator_type.update(self.operator_type_qconfig)
        return stages

    # -- declarations ------------------------------------------------------------------------------

    def quantization_capabilities(self) -> tuple[Capability, ...]:
        if self.global_config is None:
            return ()
        return declared_capabilities(
            is_dynamic=bool(is_dynamic(self.global_config)),
            reduce_range=self.reduce_range,
            enable_matmul=self.enable_matmul,
            is_qat=self.global_config.is_qat,
        )

    # -- transform and annotation ------------------------------------------------------------------

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """A conv1d / conv2d with ``padding="valid"``, or ``"same"`` padding both sides alike,
        becomes the conv with explicit padding it equals (x86's patterns, and inductor's int8
        conv, take it so). Returns a new GraphModule (sharing ``model``'s tensors) when
        anything changes; ``model`` itself is never modified."""
        return explicit_padding_convs(model)

    def _accepts(self, stage: ConfigStage) -> Callable[[list[Node]], bool]:
        """Which patterns a stage claims: a module-name stage the patterns wholly inside its
        module, an operator stage those with a node of its operator, the global stage those
        with exactly one op the global config quantizes."""
        if stage.kind == "module_name":
            return stage.accepts_all
        if stage.kind == "operator_type":
            return lambda nodes: stage.anchors(n.target for n in nodes)
        quantizable = QUANTIZABLE if self.enable_matmul else DEFAULT_QUANTIZABLE
        return lambda nodes: sum(n.target in quantizable or weight_matmul(n) is not None for n in nodes) == 1

    def annotate(self, model: GraphModule) -> GraphModule:
        warn_unknown_modules(model, "set_module_name_qconfig", self.module_name_qconfig, quantizer=self.name)
        configs = self._configs()
        mode = Mode.QAT if any(c.is_qat for c in configs.configs()) else Mode.STATIC
        for stage in configs.stages(exclusive=False, include_global=False):
            matmul = self.enable_matmul or stage.kind != "global"
            steps = TABLE.steps_for(mode, options={"enable_matmul"} if matmul else ())
            StageAnnotator(stage, self._accepts(stage)).run(model, steps)
        share_outputs_of_int8_in_int8_out(model)
        TABLE.explain_float(model, self._why_float)
        return model

    def __repr__(self) -> str:
        parts = [f"name={self.name!r}", f"global={describe_config(self.global_config)}"]
        parts += [f"reduce_range={self.reduce_range}", f"enable_matmul={self.enable_matmul}"]
        if self.module_name_qconfig:
            names = ", ".join(f"{n!r}: {describe_config(c)}" for n, c in self.module_name_qconfig.items())
            parts.append(f"module_name={{{names}}}")
        if self.operator_type_qconfig:
            ops = ", ".join(f"{op}: {describe_config(c)}" for op, c in self.operator_type_qconfig.items())
            parts.append(f"operator_type={{{ops}}}")
        return f"{type(self).__name__}({', '.join(parts)})"

    # -- why nodes stay float ------------------------------------------------------------------

    def _why_float(self, node: Node) -> str:
        """Why a node of one of x86's patterns stayed float: the checks that come before the
        rows (string padding, matmul opt-in, no config), then the rows' reasons."""
        target = node.target
        if target in PADDING_CONVS:
            return why_padding_conv_float(node)
        if (
            target == MATMUL
            and not self.enable_matmul
            and target not in self.operator_type_qconfig
            and weight_matmul(node) is None
        ):
            return (
                "matmul is opt-in: X86InductorQuantizer(enable_matmul=True) or "
                "set_function_type_qconfig(torch.matmul, config)"
            )
        covering = self._configs().covering(node)
        applies = covering.config is not None
        if not applies and target in QUANTIZABLE:
            return _NO_CONFIG if covering.kind == "global" else f"{covering.description} configured None"
        reason = TABLE.reason(node) or in_place_reason(node, "x86")
        if reason is not None:
            return reason
        if not applies:
            return _NO_CONFIG
        return f"{op_name(node)} was not matched by an x86 pattern here"

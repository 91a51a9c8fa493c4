"""XNNPACK quantizer: ExecuTorch's XNNPACK recipe, matched on the exported aten graph.

The recipe (semantics of ExecuTorch 1.5.1's ``XNNPACKQuantizer``, so the XNNPACK
partitioner lowers the result):

- int8 activations (per-tensor affine, ``[act_qmin, act_qmax]``, default [-128, 127]; dynamic
  configs may take them per token with ``act_granularity="per_token"``),
  int8 symmetric weights (per-tensor, or per-channel with ``is_per_channel``; default
  [-127, 127], 4-bit with ``weight_qmin=-8, weight_qmax=7``), float bias;
- patterns, in this order (the first to claim a node wins): conv + batch norm (+ relu),
  conv_transpose + batch norm (+ relu) [QAT configs], linear + relu, linear, conv,
  conv_transpose, conv + relu,
  conv_transpose + relu, adaptive_avg_pool2d, add + relu, add, mul + relu, mul, cat.
  A dynamic config applies only linear, conv (4-D, non-depthwise weight) and
  conv_transpose (plus conv / conv_transpose + batch norm when it is also QAT);
- a conv whose only user is relu is left to conv + relu; conv_transpose only with
  ``groups == 1``, its weight per-channel along axis 1 (its output channels);
- add / mul: scalar operands become buffers first (:meth:`XNNPACKQuantizer.transform_for_annotation`);
  an operand that is not a float32 tensor, or a scalar beyond ``torch.histc``'s range
  (> 3.4e15), leaves the node float;
- cat: the first input whose qparams come from an annotated producer owns the observer;
  the other inputs and the output share it. adaptive_avg_pool2d: input shares the
  producer's output qparams when it has them, output shares the input;
- afterwards, relu, relu6, hardtanh, max_pool2d, mean, permute, transpose, squeeze, view,
  reshape, slice, flatten, dropout and adaptive_avg_pool2d whose input has output qparams
  share them (input and output).

Configs: module name > module type > operator type > global, selecting each pattern by its
anchor op (the conv, linear, add...); ``set_filter_function`` must accept every compute node
of a pattern; a config of ``None`` leaves the matched nodes float and records why.
Everything is matched on aten ops (not source partitions), so functional and module forms
are found under default non-strict ``torch.export``. Differences from ExecuTorch are
listed in the package README.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.authoring import ConfigStage, ConfigStages, NodeFilter, calls, op_matches
from quantweave.plugin_api import Capability, is_annotated, mark_annotated, set_skip_reason, warn_unknown_modules

from ._capabilities import declared_capabilities
from ._config import ACT_GRANULARITIES, get_symmetric_quantization_config
from ._patterns import Match
from ._rewrite import scalars_to_buffers
from ._rules import MATCHERS, Matcher, steps_for
from ._share import explain_float, share_qparams

__all__ = ["ACT_GRANULARITIES", "XNNPACKQuantizer", "get_symmetric_quantization_config"]

#: matcher names, in the order they are applied
SUPPORTED_PATTERNS: tuple[str, ...] = tuple(m.name for m in MATCHERS)


class XNNPACKQuantizer(qw.Quantizer):
    """ExecuTorch's XNNPACK recipe (see the module docstring), configured like ExecuTorch's
    ``XNNPACKQuantizer``: nothing is quantized until a config is set::

        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))

    ``qw.get_quantizer("xnnpack", **options)`` returns one whose global config is
    ``get_symmetric_quantization_config(**options)``.
    """

    name = "xnnpack"

    def __init__(self) -> None:
        self.configs = ConfigStages()
        self.filter_fn: NodeFilter | None = None

    # -- configuration -------------------------------------------------------------------------

    @property
    def global_config(self) -> qw.QuantizationConfig | None:
        return self.configs.global_config

    @property
    def operator_type_config(self) -> dict[Any, qw.QuantizationConfig | None]:
        return self.configs.operator_type

    @property
    def module_type_config(self) -> dict[type, qw.QuantizationConfig | None]:
        return self.configs.module_type

    @property
    def module_name_config(self) -> dict[str, qw.QuantizationConfig | None]:
        return self.configs.module_name

    def set_global(self, quantization_config: qw.QuantizationConfig | None) -> XNNPACKQuantizer:
        """The config for every node no module name, module type or operator type config claims."""
        self.configs.set_global(quantization_config)
        return self

    def get_global_quantization_config(self) -> qw.QuantizationConfig | None:
        return self.global_config

    def set_operator_type(
        self, operator_type: Any, quantization_config: qw.QuantizationConfig | None
    ) -> XNNPACKQuantizer:
        """Config for the patterns anchored on one aten op (``torch.ops.aten.linear.default``,
        or a packet such as ``torch.ops.aten.conv2d`` for all its overloads)."""
        if not isinstance(operator_type, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            raise TypeError(
                f"set_operator_type: expected an aten op such as torch.ops.aten.linear.default; got {operator_type!r}"
            )
        if not any(op_matches(operator_type, t) for m in MATCHERS for t in m.anchors):
            anchors = sorted({str(t) for m in MATCHERS for t in m.anchors})
            raise ValueError(
                f"set_operator_type: {operator_type} anchors no XNNPACK pattern; supported: {', '.join(anchors)}"
            )
        self.configs.set_operator_type(operator_type, quantization_config)
        return self

    def set_module_type(
        self, module_type: type[torch.nn.Module], quantization_config: qw.QuantizationConfig | None
    ) -> XNNPACKQuantizer:
        """Config for every pattern inside a submodule of type ``module_type`` (any depth)."""
        self.configs.set_module_type(module_type, quantization_config)
        return self

    def set_module_name(self, module_name: str, quantization_config: qw.QuantizationConfig | None) -> XNNPACKQuantizer:
        """Config for every pattern inside the submodule ``module_name`` (e.g. ``"blocks.0"``);
        ``None`` leaves it float."""
        self.configs.set_module_name(module_name, quantization_config)
        return self

    def set_filter_function(self, filter_fn: NodeFilter | None) -> XNNPACKQuantizer:
        """Quantize only patterns whose compute nodes all pass ``filter_fn(node)`` (applied on
        top of every config, and to the qparam sharing that follows)."""
        if filter_fn is not None and not callable(filter_fn):
            raise TypeError(f"set_filter_function: expected a callable or None; got {filter_fn!r}")
        self.filter_fn = filter_fn
        return self

    # -- declarations --------------------------------------------------------------------------

    def quantization_capabilities(self) -> tuple[Capability, ...]:
        config = self.global_config
        if config is None or config.input_activation is None or config.weight is None:
            return ()
        act, weight = config.input_activation, config.weight
        return declared_capabilities(
            is_per_channel=weight.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine),
            is_qat=config.is_qat,
            is_dynamic=act.is_dynamic,
            act_granularity="per_token" if act.per_token else "per_tensor",
            act_qmin=act.quant_min if act.quant_min is not None else -128,
            act_qmax=act.quant_max if act.quant_max is not None else 127,
            weight_qmin=weight.quant_min if weight.quant_min is not None else -128,
            weight_qmax=weight.quant_max if weight.quant_max is not None else 127,
            weight_group_size=weight.group_size,
        )

    # -- transform and annotation --------------------------------------------------------------

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Python-number operands of float32 add / mul become 0-d float32 buffers, so they can
        be observed. Returns a new GraphModule (sharing ``model``'s tensors) when anything
        changes; ``model`` itself is never modified -- except the working copy of the caller's
        graph that ``prepare_pt2e`` hands over, which is rewritten in place (no second copy)."""
        return scalars_to_buffers(model)

    def annotate(self, model: GraphModule) -> GraphModule:
        warn_unknown_modules(model, "set_module_name", self.module_name_config, quantizer=self.name)
        warn_unknown_modules(model, "set_module_type", self.module_type_config, quantizer=self.name)
        # one node per op the graph calls: a matcher none of whose anchor ops is called finds nothing
        # (every match is anchored on a node calling one of them; matching writes only node meta)
        called = _one_node_per_op(model)
        # module name > module type > operator type > global; without a global config nothing else is claimed
        for stage in self.configs.stages(exclusive=True, include_global=False):
            for matcher in steps_for(stage.config):
                if not stage.anchors(matcher.anchors):
                    continue
                if not any(calls(node, matcher.anchors) for node in called):
                    continue
                for match in matcher(model):
                    self._apply(stage, matcher, match)
        share_qparams(model, self.filter_fn)
        explain_float(model, self.filter_fn, self._dynamic_only())
        return model

    def _dynamic_only(self) -> bool:
        """True when every config this quantizer holds is dynamic."""
        configs = self.configs.configs()
        act = [c.input_activation for c in configs]
        return bool(configs) and all(a is not None and a.is_dynamic for a in act)

    def _apply(self, stage: ConfigStage, matcher: Matcher, match: Match) -> None:
        if is_annotated(match.nodes):
            return
        if not stage.anchors([match.anchor.target]):
            return
        # a stage selects patterns by their anchor op (the conv, linear, add...); the user's
        # filter function must accept every compute node of the pattern
        if not stage.accepts(match.anchor):
            return
        if self.filter_fn is not None and not all(self.filter_fn(n) for n in match.nodes):
            return
        if stage.config is None:
            mark_annotated(match.nodes)
            for node in match.nodes:
                set_skip_reason(node, f"{stage.description} is configured None ({matcher.name})")
            return
        reason = match.annotate(stage.config)
        if reason is not None:
            set_skip_reason(match.anchor, f"{matcher.name}: {reason}")
            return
        mark_annotated(match.nodes)

    def validate(self, model: GraphModule) -> None:
        return None


def _one_node_per_op(model: GraphModule) -> list[Node]:
    """The first call_function node of each target in ``model`` (all of them when a target
    cannot be hashed): ``calls`` reads only a node's op and target."""
    first: dict[Any, Node] = {}
    for node in model.graph.nodes:
        if node.op == "call_function":
            try:
                first.setdefault(node.target, node)
            except TypeError:
                return [n for n in model.graph.nodes if n.op == "call_function"]
    return list(first.values())

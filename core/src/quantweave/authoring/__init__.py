"""The authoring kit: what a quantizer plugin needs beyond the contract in :mod:`quantweave.plugin_api`.

First-party plugins are written on this module and :mod:`quantweave.plugin_api` only, as a
third party would. See docs/authoring.md for examples. This module only re-exports:

- graph: :func:`calls`, :func:`op_matches`, :func:`node_op`, :func:`op_name`,
  :func:`describe_node`, :func:`only_user`, :func:`first_user`, :func:`tensor_value`,
  :func:`is_float_tensor`, :func:`attr_value`, :func:`module_attr`,
  :func:`copy_for_rewrite` / :func:`finish_rewrite`;
- modules: :func:`module_paths`, :func:`module_types`, :func:`type_name`,
  :func:`in_module`, :func:`in_module_type`;
- configs: :class:`ConfigStages` (module name > module type > operator type > global),
  :class:`ConfigStage`, :func:`check_config`, :func:`config_key`;
- observers: :func:`activation_observer`, :func:`weight_observer`;
- float reasons: :func:`mark_float`, :func:`explain_float`, :func:`has_skip_reason`,
  :func:`in_place_reason`;
- rule tables: :class:`Rule`, :class:`RuleTable`;
- linears written as matrix products: :func:`weight_matmul` (``addmm`` / ``mm`` / ``matmul``
  of an activation and a constant ``[in, out]`` weight), :class:`WeightMatmul`,
  :data:`WEIGHT_AXIS`, :data:`WEIGHT_MATMUL_OPS`, :func:`channel_axis_spec` (a weight spec on
  another channel axis); lowering: :func:`products_as_linears` (such a product, converted, as
  the int8 linear backends match);
- sharing: :func:`share_inputs` (a concatenation's inputs and output on one range);
- packaging: :func:`lazy_exports` (the lazy ``__init__`` of a plugin package);
- annotating (PT2E's helpers, formerly at ``quantweave``'s top level):
  :func:`annotate_input_qspec_map`, :func:`annotate_output_qspec`,
  :func:`get_input_act_qspec`, :func:`get_output_act_qspec`, :func:`get_weight_qspec`,
  :func:`get_bias_qspec`; lowering: :func:`quantize_ops`, :func:`dequantize_ops`.
"""

from .._modules.matmul import (
    WEIGHT_AXIS,
    WEIGHT_MATMUL_OPS,
    WeightMatmul,
    channel_axis_spec,
    products_as_linears,
    weight_matmul,
)
from ..annotation import (
    annotate_input_qspec_map,
    annotate_output_qspec,
    get_bias_qspec,
    get_input_act_qspec,
    get_output_act_qspec,
    get_weight_qspec,
)
from ..convert import dequantize_ops, quantize_ops
from .configs import ConfigStage, ConfigStages, check_config, config_key
from .graph import (
    attr_value,
    calls,
    copy_for_rewrite,
    describe_node,
    finish_rewrite,
    first_user,
    is_float_tensor,
    module_attr,
    node_op,
    only_user,
    op_matches,
    op_name,
    tensor_value,
)
from .lazy import lazy_exports
from .modules import NodeFilter, in_module, in_module_type, module_paths, module_types, type_name
from .observers import activation_observer, weight_observer
from .reasons import explain_float, has_skip_reason, in_place_reason, mark_float
from .rules import Rule, RuleTable
from .sharing import share_inputs

__all__ = [
    "ConfigStage",
    "ConfigStages",
    "NodeFilter",
    "Rule",
    "RuleTable",
    "WEIGHT_AXIS",
    "WEIGHT_MATMUL_OPS",
    "WeightMatmul",
    "activation_observer",
    "annotate_input_qspec_map",
    "annotate_output_qspec",
    "dequantize_ops",
    "get_bias_qspec",
    "get_input_act_qspec",
    "get_output_act_qspec",
    "get_weight_qspec",
    "quantize_ops",
    "attr_value",
    "calls",
    "channel_axis_spec",
    "check_config",
    "config_key",
    "copy_for_rewrite",
    "describe_node",
    "explain_float",
    "finish_rewrite",
    "first_user",
    "has_skip_reason",
    "share_inputs",
    "in_module",
    "in_module_type",
    "in_place_reason",
    "is_float_tensor",
    "lazy_exports",
    "mark_float",
    "module_attr",
    "module_paths",
    "module_types",
    "node_op",
    "only_user",
    "products_as_linears",
    "op_matches",
    "op_name",
    "tensor_value",
    "type_name",
    "weight_matmul",
    "weight_observer",
]

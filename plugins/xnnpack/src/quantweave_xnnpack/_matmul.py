"""Linears written as matrix products (GPT-2's ``Conv1D`` as ``addmm``, ``x @ W``): the matcher
of the rule table's ``addmm`` / ``mm`` / ``matmul_weight`` rows. The weight is stored
``[in, out]``: per channel, its output channels are axis 1."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave import authoring
from quantweave.authoring import calls, channel_axis_spec, op_name, weight_matmul

from ._blockwise import is_groupwise
from ._patterns import Match

__all__ = ["GROUPWISE_PRODUCT", "NOT_A_WEIGHT_MATMUL", "WEIGHT_MATMULS", "find_weight_matmul"]

WEIGHT_MATMULS = frozenset(authoring.WEIGHT_MATMUL_OPS)
NOT_A_WEIGHT_MATMUL = (
    "{op} is quantized for XNNPACK only as a linear: a float32 activation times a constant 2-D weight "
    "(a parameter or buffer, stored [in, out]), with a constant 1-D bias for addmm; here it is not "
    "(a product of two activations stays float)"
)

GROUPWISE_PRODUCT = (
    "{op} stays float under group-wise (blockwise 4-bit) weights: its weight is stored [in, out] and "
    "XNNPACK's groups run along a row of an [out, in] linear weight; write the layer as nn.Linear or give it "
    "an 8-bit config (set_module_name / set_module_type)"
)


def _float(reason: str) -> Callable[[qw.QuantizationConfig], str | None]:
    def annotate(config: qw.QuantizationConfig) -> str | None:
        return reason

    return annotate


def find_weight_matmul(gm: GraphModule) -> Iterator[Match]:
    for node in list(gm.graph.nodes):
        if not calls(node, WEIGHT_MATMULS):
            continue
        found = weight_matmul(node)
        if found is None:  # said why, in the report
            yield Match([node], node, _float(NOT_A_WEIGHT_MATMUL.format(op=op_name(node))))
            continue

        def annotate(
            config: qw.QuantizationConfig, node: Node = node, found: authoring.WeightMatmul = found
        ) -> str | None:
            if is_groupwise(config):
                return GROUPWISE_PRODUCT.format(op=op_name(node))
            x, weight, bias = found
            authoring.annotate_input_qspec_map(node, x, config.input_activation)
            authoring.annotate_input_qspec_map(node, weight, channel_axis_spec(config.weight))
            if bias is not None:
                authoring.annotate_input_qspec_map(node, bias, config.bias)
            authoring.annotate_output_qspec(node, config.output_activation)
            return None

        yield Match([node], node, annotate)

"""The PT2E "how to write a quantizer" tutorial flows, written against an API namespace.

``build(api)`` returns the tutorial's quantizers. Pass quantweave's names
(``quantweave.testing.reference.quantweave_api()``) or torchao's: the code is the same, only
the import paths differ -- which is the compatibility promise these tests check.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.fx import GraphModule

from quantweave.testing.reference import activation_spec, weight_spec

aten = torch.ops.aten


def symmetric_config(api: Any) -> dict[str, Any]:
    act = activation_spec(api, api.HistogramObserver.with_args(eps=2**-12), signed=True)
    weight = weight_spec(api, api.PerChannelMinMaxObserver.with_args(eps=2**-12), narrow=True)
    per_tensor_weight = weight_spec(api, api.MinMaxObserver.with_args(eps=2**-12), narrow=True, per_channel=False)
    return {"act": act, "weight": weight, "per_tensor_weight": per_tensor_weight}


def derive_bias_qparams(obs_or_fqs: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    assert len(obs_or_fqs) == 2
    act_scale, _ = obs_or_fqs[0].calculate_qparams()
    weight_scale, _ = obs_or_fqs[1].calculate_qparams()
    return torch.tensor([act_scale * weight_scale]).to(torch.float32), torch.tensor([0]).to(torch.int32)


def build(api: Any) -> types.SimpleNamespace:
    config = symmetric_config(api)
    key = "quantization_annotation"

    def claimed(node: Any) -> bool:
        return key in node.meta and node.meta[key]._annotated

    class BackendQuantizer(api.Quantizer):
        """conv2d / linear / max_pool2d with a symmetric int8 config (tutorial step 1)."""

        def annotate(self, model: GraphModule) -> GraphModule:
            for node in model.graph.nodes:
                if node.op != "call_function" or claimed(node):
                    continue
                if node.target in (aten.conv2d.default, aten.linear.default):
                    input_act, weight = node.args[0], node.args[1]
                    node.meta[key] = api.QuantizationAnnotation(
                        input_qspec_map={input_act: config["act"], weight: config["weight"]},
                        output_qspec=config["act"],
                        _annotated=True,
                    )
                elif node.target is aten.max_pool2d.default:
                    input_act = node.args[0]
                    node.meta[key] = api.QuantizationAnnotation(
                        input_qspec_map={input_act: config["act"]},
                        output_qspec=api.SharedQuantizationSpec((input_act, node)),
                        _annotated=True,
                    )
            return model

        def validate(self, model: GraphModule) -> None:
            pass

    class AddSharedQuantizer(api.Quantizer):
        """add: the second input and the output share the first input's qparams."""

        def annotate(self, model: GraphModule) -> GraphModule:
            for node in model.graph.nodes:
                if node.op != "call_function" or node.target is not aten.add.Tensor:
                    continue
                input_act0, input_act1 = node.args[0], node.args[1]
                shared = api.SharedQuantizationSpec((input_act0, node))
                node.meta[key] = api.QuantizationAnnotation(
                    input_qspec_map={input_act0: config["act"], input_act1: shared},
                    output_qspec=shared,
                    _annotated=True,
                )
            return model

        def validate(self, model: GraphModule) -> None:
            pass

    class SigmoidFixedQuantizer(api.Quantizer):
        """sigmoid: fixed output qparams (scale 1/256, zero point 0)."""

        def annotate(self, model: GraphModule) -> GraphModule:
            fixed = api.FixedQParamsQuantizationSpec(
                dtype=torch.uint8,
                quant_min=0,
                quant_max=255,
                qscheme=torch.per_tensor_affine,
                scale=1.0 / 256.0,
                zero_point=0,
            )
            for node in model.graph.nodes:
                if node.op == "call_function" and node.target is aten.sigmoid.default:
                    node.meta[key] = api.QuantizationAnnotation(
                        input_qspec_map={node.args[0]: config["act"]},
                        output_qspec=fixed,
                        _annotated=True,
                    )
            return model

        def validate(self, model: GraphModule) -> None:
            pass

    class ConvDerivedBiasQuantizer(api.Quantizer):
        """conv2d with an int32 bias whose scale is act_scale * weight_scale."""

        def annotate(self, model: GraphModule) -> GraphModule:
            for node in model.graph.nodes:
                if node.op != "call_function" or node.target is not aten.conv2d.default:
                    continue
                input_act, weight, bias = node.args[0], node.args[1], node.args[2]
                bias_qspec = api.DerivedQuantizationSpec(
                    derived_from=[(input_act, node), (weight, node)],
                    derive_qparams_fn=derive_bias_qparams,
                    dtype=torch.int32,
                    quant_min=-(2**31),
                    quant_max=2**31 - 1,
                    qscheme=torch.per_tensor_symmetric,
                )
                node.meta[key] = api.QuantizationAnnotation(
                    input_qspec_map={
                        input_act: config["act"],
                        weight: config["per_tensor_weight"],
                        bias: bias_qspec,
                    },
                    output_qspec=config["act"],
                    _annotated=True,
                )
            return model

        def validate(self, model: GraphModule) -> None:
            pass

    class CatSharedQuantizer(api.Quantizer):
        """conv outputs into cat; every cat input and its output share the first input."""

        def annotate(self, model: GraphModule) -> GraphModule:
            for node in model.graph.nodes:
                if node.op != "call_function":
                    continue
                if node.target is aten.conv2d.default:
                    node.meta[key] = api.QuantizationAnnotation(
                        input_qspec_map={node.args[0]: config["act"], node.args[1]: config["weight"]},
                        output_qspec=config["act"],
                        _annotated=True,
                    )
                elif node.target is aten.cat.default:
                    first, *rest = node.args[0]
                    shared = api.SharedQuantizationSpec((first, node))
                    input_map = {first: config["act"]}
                    input_map.update({other: shared for other in rest})
                    node.meta[key] = api.QuantizationAnnotation(
                        input_qspec_map=input_map, output_qspec=shared, _annotated=True
                    )
            return model

        def validate(self, model: GraphModule) -> None:
            pass

    return types.SimpleNamespace(
        BackendQuantizer=BackendQuantizer,
        AddSharedQuantizer=AddSharedQuantizer,
        SigmoidFixedQuantizer=SigmoidFixedQuantizer,
        ConvDerivedBiasQuantizer=ConvDerivedBiasQuantizer,
        CatSharedQuantizer=CatSharedQuantizer,
    )


class ConvLinearPool(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.linear = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(self.conv(x), 2)
        return self.linear(x.flatten(1))


class AddModel(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class SigmoidModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(x))


class ConvBias(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class TwoConvCat(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3)
        self.conv2 = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.conv1(x), self.conv2(x)], dim=1)


# (model factory, example inputs, quantizer name) for each tutorial flow
FLOWS = {
    "backend_conv_linear_maxpool": (ConvLinearPool, lambda: (torch.randn(2, 3, 8, 8),), "BackendQuantizer"),
    "add_shared": (AddModel, lambda: (torch.randn(4, 8), torch.randn(4, 8) * 3), "AddSharedQuantizer"),
    "sigmoid_fixed": (SigmoidModel, lambda: (torch.randn(4, 16),), "SigmoidFixedQuantizer"),
    "conv_derived_bias": (ConvBias, lambda: (torch.randn(2, 3, 8, 8),), "ConvDerivedBiasQuantizer"),
    "cat_shared": (TwoConvCat, lambda: (torch.randn(2, 3, 8, 8),), "CatSharedQuantizer"),
}

"""The seed PT2E tutorial's ``BackendQuantizer`` ("How to Write a Quantizer for PyTorch 2 Export
Quantization"), written from the tutorial's text against an API namespace: ``build(api)``
takes quantweave's names or torchao's, so the code is the same and only the imports differ.

As in the tutorial: int8 per-tensor affine activations observed with a HistogramObserver
(eps 2**-12), int8 weights with a MinMaxObserver, the bias as a float32 spec with a
``PlaceholderObserver`` (left float), max_pool2d's output sharing its input's qparams, add's
second input and output sharing the first input's, sigmoid's output with fixed qparams.
"""

from __future__ import annotations

import types
from typing import Any

import torch


def api_of(quantizer_module: Any, observer_module: Any) -> types.SimpleNamespace:
    names = ["QuantizationSpec", "SharedQuantizationSpec", "FixedQParamsQuantizationSpec", "QuantizationAnnotation"]
    observers = ["HistogramObserver", "MinMaxObserver", "PlaceholderObserver", "PerChannelMinMaxObserver"]
    return types.SimpleNamespace(
        Quantizer=quantizer_module.Quantizer,
        **{n: getattr(quantizer_module, n) for n in names},
        **{n: getattr(observer_module, n) for n in observers},
    )


def quantweave_names() -> types.SimpleNamespace:
    import quantweave
    from quantweave import observers

    return api_of(quantweave, observers)


def torchao_names() -> types.SimpleNamespace:
    import torchao.quantization.pt2e.observer as observers
    import torchao.quantization.pt2e.quantizer as quantizer

    return api_of(quantizer, observers)


def build(api: Any, weight_per_channel: bool = False) -> Any:
    act_quantization_spec = api.QuantizationSpec(
        dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_tensor_affine,
        is_dynamic=False,
        observer_or_fake_quant_ctr=api.HistogramObserver.with_args(eps=2**-12),
    )
    if weight_per_channel:  # a per-channel weight with ch_axis left unset (the observer's default applies)
        weight_quantization_spec = api.QuantizationSpec(
            dtype=torch.int8,
            quant_min=-127,
            quant_max=127,
            qscheme=torch.per_channel_symmetric,
            is_dynamic=False,
            observer_or_fake_quant_ctr=api.PerChannelMinMaxObserver,
        )
    else:
        weight_quantization_spec = api.QuantizationSpec(
            dtype=torch.int8,
            quant_min=-128,
            quant_max=127,
            qscheme=torch.per_tensor_affine,
            is_dynamic=False,
            observer_or_fake_quant_ctr=api.MinMaxObserver,
        )
    bias_observer_or_fake_quant_ctr = api.PlaceholderObserver
    bias_quantization_spec = api.QuantizationSpec(
        dtype=torch.float, observer_or_fake_quant_ctr=bias_observer_or_fake_quant_ctr
    )
    sigmoid_output_spec = api.FixedQParamsQuantizationSpec(
        dtype=torch.uint8,
        scale=1.0 / 256.0,
        zero_point=0,
        quant_min=0,
        quant_max=255,
        qscheme=torch.per_tensor_affine,
    )

    class BackendQuantizer(api.Quantizer):
        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            for node in model.graph.nodes:
                if node.op != "call_function":
                    continue
                if node.target == torch.ops.aten.conv2d.default:
                    input_act, weight = node.args[0], node.args[1]
                    input_qspec_map = {input_act: act_quantization_spec, weight: weight_quantization_spec}
                    if len(node.args) > 2 and node.args[2] is not None:
                        input_qspec_map[node.args[2]] = bias_quantization_spec
                    node.meta["quantization_annotation"] = api.QuantizationAnnotation(
                        input_qspec_map=input_qspec_map,
                        output_qspec=act_quantization_spec,
                        _annotated=True,
                    )
                elif node.target == torch.ops.aten.max_pool2d.default:
                    maxpool_node = node
                    input_act = maxpool_node.args[0]
                    maxpool_node.meta["quantization_annotation"] = api.QuantizationAnnotation(
                        input_qspec_map={input_act: act_quantization_spec},
                        output_qspec=api.SharedQuantizationSpec((input_act, maxpool_node)),
                        _annotated=True,
                    )
                elif node.target == torch.ops.aten.add.Tensor:
                    add_node = node
                    input_act0, input_act1 = add_node.args[0], add_node.args[1]
                    share_qparams_with_input_act0_qspec = api.SharedQuantizationSpec((input_act0, add_node))
                    add_node.meta["quantization_annotation"] = api.QuantizationAnnotation(
                        input_qspec_map={
                            input_act0: act_quantization_spec,
                            input_act1: share_qparams_with_input_act0_qspec,
                        },
                        output_qspec=share_qparams_with_input_act0_qspec,
                        _annotated=True,
                    )
                elif node.target == torch.ops.aten.sigmoid.default:
                    node.meta["quantization_annotation"] = api.QuantizationAnnotation(
                        input_qspec_map={node.args[0]: act_quantization_spec},
                        output_qspec=sigmoid_output_spec,
                        _annotated=True,
                    )
            return model

        def validate(self, model: torch.fx.GraphModule) -> None:
            pass

    return BackendQuantizer()


class TutorialNet(torch.nn.Module):
    """conv (with bias) -> max_pool2d, a second conv, add, sigmoid: every pattern the quantizer annotates."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(6, 6, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(self.conv1(x), 2)
        return torch.sigmoid(y + self.conv2(y))

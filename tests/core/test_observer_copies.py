"""Convert copies only the observers it writes into and those linked to them
(``_modules/observer_copies``, issue 25): a derived observer reads the copy of its source, an
observer linked to nothing stays shared, the prepared model's observers are untouched."""

import torch

import quantweave as qw
from quantweave._modules.observer_copies import copy_observers
from quantweave.authoring import annotate_input_qspec_map
from quantweave.observers import DerivedObserver, MinMaxObserver, PerGroupMinMaxObserver
from quantweave.plugin_api import mark_annotated


def _derived(*sources):
    return DerivedObserver(
        list(sources), lambda obs: obs[0].calculate_qparams(), torch.int8, -128, 127, torch.per_tensor_affine
    )


def test_the_written_observers_and_those_linked_to_them_are_copied_together():
    weight = PerGroupMinMaxObserver(group_size=4)
    bias = _derived(weight)  # refers to the written one
    of_bias = _derived(bias)  # through another observer
    helper = MinMaxObserver()
    weight.helper = [helper]  # the written one refers to it (in a container)
    unrelated = MinMaxObserver()
    modules = {"w": weight, "b": bias, "bb": of_bias, "h": helper, "u": unrelated, "w_again": weight}
    copies = copy_observers(modules, {"w"})
    assert set(copies) == {"w", "b", "bb", "h", "w_again"}  # "u" stays shared
    assert copies["w"] is copies["w_again"] and copies["w"] is not weight
    assert copies["b"].sources[0] is copies["w"] and copies["bb"].sources[0] is copies["b"]
    assert copies["w"].helper[0] is copies["h"]
    copies["w"](torch.randn(3, 8))
    assert copies["w"].min_val.shape == (3, 2) and weight.min_val.numel() == 0  # the original saw nothing


def test_convert_leaves_the_prepared_models_observers_as_they_were():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 8)

        def forward(self, x):
            return self.fc(x)

    class Q(qw.Quantizer):
        def annotate(self, model):
            spec = qw.QuantizationSpec(
                dtype=torch.int8,
                quant_min=-8,
                quant_max=7,
                qscheme=torch.per_channel_symmetric,
                ch_axis=0,
                group_size=8,
                observer_or_fake_quant_ctr=PerGroupMinMaxObserver,
            )
            for node in model.graph.nodes:
                if node.target == torch.ops.aten.linear.default:
                    annotate_input_qspec_map(node, node.args[1], spec)
                    mark_annotated(node)
            return model

    x = torch.randn(2, 16)
    prepared = qw.prepare_pt2e(torch.export.export(Net().eval(), (x,)).module(), Q())
    before = {
        name: (module, module.min_val.clone()) for name, module in prepared.named_modules() if "post_process" in name
    }
    converted = qw.convert_pt2e(prepared)
    assert len(before) == 1
    for name, (module, min_val) in before.items():
        assert prepared.get_submodule(name) is module and torch.equal(module.min_val, min_val)  # never observed
    assert any(t.dtype == torch.int8 for t in converted.buffers())

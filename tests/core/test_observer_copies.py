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


class _Holder(torch.nn.Module):
    """Buffers of every kind the fast copy must copy as deepcopy does."""

    def __init__(self):
        super().__init__()
        self.register_buffer("empty", torch.tensor([]))
        self.register_buffer("filled", torch.arange(6.0))
        base = torch.arange(8.0)
        self.register_buffer("base", base)
        self.register_buffer("view", base[2:6])  # shares base's storage
        tagged = torch.ones(3)
        tagged.note = "kept"  # a Python attribute on the tensor
        self.register_buffer("tagged", tagged)
        self.alias = [self.filled]  # the same tensor object, reached another way


def test_copies_are_what_deepcopy_makes_sharing_included():
    import copy

    holder = _Holder()
    fast = copy_observers({"h": holder}, {"h"})["h"]
    slow = copy.deepcopy(holder)
    for name, tensor in slow.state_dict().items():
        assert torch.equal(fast.state_dict()[name], tensor), name
    assert fast.alias[0] is fast.filled  # one copy per tensor object
    assert fast.tagged.note == "kept"
    fast.base[3] = 100.0  # the view still shares its base's (copied) storage
    assert fast.view[1] == 100.0
    fast.filled.add_(1)  # and nothing is shared with the original
    assert torch.equal(holder.filled, torch.arange(6.0)) and holder.base[3] == 3.0

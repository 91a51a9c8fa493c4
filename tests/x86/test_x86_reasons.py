"""quantweave-x86 says why it leaves a node of one of its patterns float (set_skip_reason),
and shows its configuration in its repr."""

import torch
import torch.nn.functional as F

import quantweave as qw
from quantweave.plugin_api import SKIP_REASON_KEY, is_annotated, set_skip_reason
from quantweave_x86 import X86InductorQuantizer, declared_capabilities, get_default_x86_inductor_quantization_config
from tests.helpers import export


class Mixed(torch.nn.Module):
    """One instance of every rule under which x86 leaves one of its ops float."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        a = torch.relu(x + y)  # add of two inputs, relu after it: no conv / linear to fuse with
        b = x * y[:, :1]  # mul of differently shaped tensors (broadcast)
        c = torch.cat([self.conv(a), torch.sigmoid(b)], 1)  # one input of cat is float
        d = F.max_pool2d(torch.sigmoid(c), 2)  # pooling after a float op
        e = torch.flatten(d, 1)  # flatten with no quantized consumer
        f = torch.matmul(e, e.t())  # matmul is opt-in
        return f, torch.tanh(self.fc(e[:, :4]).sum() * e)  # tanh after a mul, not after the linear


def reasons(quantizer, model=None):
    gm = export(model or Mixed(), torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8))
    quantizer.annotate(gm)
    return {n.name: n.meta.get(SKIP_REASON_KEY) for n in gm.graph.nodes if n.op == "call_function"}, gm


def test_every_rule_that_leaves_an_x86_op_float_is_recorded():
    found, _ = reasons(X86InductorQuantizer())
    assert found["add"].startswith("add is quantized by x86 only fused after a conv2d or linear")
    assert found["add"].endswith("neither input is a conv2d or linear")
    assert found["relu"] == (
        "relu is quantized by x86 only fused after conv1d, conv2d, linear, or their add; its input add is float"
    )
    assert (
        found["mul"]
        == "mul is quantized by x86 only for inputs of the same shape; here (1, 3, 8, 8) x (1, 1, 8, 8) (broadcast)"
    )
    assert found["cat"].startswith("cat is quantized by x86 only when every input is the output of a quantized x86")
    assert found["cat"].endswith("here sigmoid is float")
    assert found["max_pool2d"] == (
        "input is not quantized by an x86 pattern (max_pool2d is quantized only when its input is): sigmoid_1 "
        "(sigmoid) is float"
    )
    assert found["flatten"] == (
        "input is not quantized by an x86 pattern (flatten is quantized only when its input is): max_pool2d is float"
    )
    assert found["matmul"].startswith("matmul is opt-in")
    assert found["tanh"].startswith("tanh is quantized by x86 only fused after linear; here it follows mul_1")


def test_no_op_of_an_x86_pattern_is_left_float_without_a_reason():
    ops = {op for cap in declared_capabilities(is_qat=True, enable_matmul=True) for op in cap.ops}
    for quantizer in (X86InductorQuantizer(), X86InductorQuantizer(enable_matmul=True)):
        found, gm = reasons(quantizer)
        for node in gm.graph.nodes:
            if str(node.target) in ops and not is_annotated(node):
                assert found[node.name], f"{node.name} ({node.target}) left float without a reason"


def test_no_config_covering_a_node_is_the_reason():
    quantizer = (
        X86InductorQuantizer()
        .set_global(None)
        .set_module_name_qconfig("fc", get_default_x86_inductor_quantization_config())
    )
    found, _ = reasons(quantizer)
    assert found["conv2d"].startswith("no x86 config covers it (the global config is None")


def test_a_reason_an_earlier_quantizer_recorded_is_kept():
    class First(qw.Quantizer):
        name = "first"

        def annotate(self, model):
            for node in model.graph.nodes:
                if node.target == torch.ops.aten.max_pool2d.default:
                    set_skip_reason(node, "first: pooling is left to the runtime")
            return model

    found, _ = reasons(qw.ComposableQuantizer([First(), X86InductorQuantizer()]))
    assert found["max_pool2d"] == "first: pooling is left to the runtime"
    assert found["flatten"].startswith("input is not quantized by an x86 pattern")


def test_a_flatten_nothing_quantized_consumes_is_not_quantized():
    class ConvFlatten(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x, y):
            return torch.sigmoid(torch.flatten(self.conv(x), 1))

    found, _ = reasons(X86InductorQuantizer(), ConvFlatten())
    assert found["flatten"] == (
        "not followed by a quantized consumer (x86 quantizes flatten only when a conv / linear / mul uses it)"
    )


def test_repr_names_the_quantizer_and_its_configuration():
    assert repr(X86InductorQuantizer()) == (
        "X86InductorQuantizer(name='x86', global=default(static), reduce_range=False, enable_matmul=False)"
    )
    assert repr(X86InductorQuantizer(is_dynamic=True, reduce_range=True, enable_matmul=True)) == (
        "X86InductorQuantizer(name='x86', global=default(dynamic, reduce_range), reduce_range=True, enable_matmul=True)"
    )
    custom = qw.QuantizationConfig(None, None, get_default_x86_inductor_quantization_config().weight, None)
    quantizer = (
        X86InductorQuantizer(is_qat=True)
        .set_module_name_qconfig("fc", None)
        .set_function_type_qconfig(torch.matmul, get_default_x86_inductor_quantization_config(is_qat=True))
    )
    assert repr(quantizer) == (
        "X86InductorQuantizer(name='x86', global=default(qat), reduce_range=False, enable_matmul=False, "
        "module_name={'fc': None}, operator_type={aten.matmul.default: default(qat)})"
    )
    assert repr(X86InductorQuantizer().set_global(custom)).startswith(
        "X86InductorQuantizer(name='x86', global=QuantizationConfig(activation=None, weight=int8[-128,127] "
        "per_channel axis 0 sym)"
    )

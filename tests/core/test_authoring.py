"""quantweave.authoring: the helpers plugins share (graph, modules, configs, observers, reasons, rules)."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import quantweave as qw
from quantweave import authoring as kit
from quantweave.observers import HistogramObserver, PerChannelMinMaxObserver, PlaceholderObserver
from quantweave.plugin_api import FLOAT, SKIP_REASON_KEY, Mode, Quant, TensorQuant, is_annotated
from tests.helpers import assert_names, export

aten = torch.ops.aten
ACT = TensorQuant("uint8", 0, 255, "per_tensor", symmetric=False)
WEIGHT = TensorQuant("int8", -128, 127, "per_channel", symmetric=True, ch_axis=0)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return F.relu(self.linear(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding="same")
        self.block = Block()
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        y = self.conv(x).mean((2, 3))
        return self.block(y) * self.scale


@pytest.fixture
def gm():
    return export(Net(), torch.randn(1, 3, 8, 8))


def _node(gm, target):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target == target)


# -- graph ------------------------------------------------------------------------------------------


def test_calls_matches_overloads_and_packets(gm):
    linear = _node(gm, aten.linear.default)
    assert kit.calls(linear, aten.linear.default)
    assert kit.calls(linear, (aten.conv2d.default, aten.linear))  # a packet matches its overloads
    assert not kit.calls(linear, {aten.relu.default})
    assert not kit.calls("not a node", aten.linear.default)
    assert kit.op_name(linear) == "linear"
    assert kit.node_op(linear) == "aten.linear.default"


def test_calls_on_a_frozenset_agrees_with_op_matches_on_every_node(gm):
    """A frozenset of ops answers as op_matches does for each member (overloads, packets, a
    mix, and sets holding other callables), in any container, on every node of a graph."""
    import operator

    overloads = frozenset((aten.linear.default, aten.relu.default, aten.mean.dim))
    packets = frozenset((aten.conv2d, aten.mul))
    others = frozenset((operator.getitem, aten.linear.default, aten.mul))
    for ops in (overloads, packets, overloads | packets, others, frozenset(), frozenset((aten.add.Tensor,))):
        for node in gm.graph.nodes:
            expected = node.op == "call_function" and any(kit.op_matches(op, node.target) for op in ops)
            assert kit.calls(node, ops) is expected, (node.name, ops)
            assert kit.calls(node, tuple(ops)) is expected and kit.calls(node, set(ops)) is expected
    assert kit.calls(_node(gm, aten.mul.Tensor), frozenset((aten.mul,)))
    assert not kit.calls(_node(gm, aten.linear.default), frozenset((aten.linear.out, aten.relu)))


def test_users_and_descriptions(gm):
    linear = _node(gm, aten.linear.default)
    relu = kit.only_user(linear)
    assert relu is not None and relu.target == aten.relu.default
    assert kit.first_user(linear, [aten.relu.default]) is relu
    assert kit.first_user(linear, [aten.tanh.default]) is None
    assert kit.describe_node(relu) in ("relu", f"{relu.name} (relu)")
    x = next(n for n in gm.graph.nodes if n.op == "placeholder" and not n.name.startswith(("p_", "b_")))
    assert kit.describe_node(x) == f"{x.name} (placeholder)"


def test_tensor_values(gm):
    linear = _node(gm, aten.linear.default)
    assert kit.tensor_value(linear).shape == (1, 4)
    assert kit.is_float_tensor(linear)
    assert not kit.is_float_tensor(linear, dtypes=(torch.float16,))
    assert not kit.is_float_tensor(3.0)


def test_attr_value_reads_get_attr_nodes_and_names_missing_paths(gm):
    weight = next(n for n in gm.graph.nodes if n.op == "get_attr" and "weight" in str(n.target))
    assert kit.attr_value(weight) is kit.module_attr(gm, str(weight.target))
    assert kit.attr_value(_node(gm, aten.linear.default)) is None  # not a get_attr node
    with pytest.raises(AttributeError, match=r"no_such\.path"):
        kit.module_attr(gm, "no_such.path")


def test_copy_for_rewrite_never_touches_the_callers_graph(gm):
    before = [(n.name, n.target, n.args) for n in gm.graph.nodes]
    code = gm.code
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no LeafSpec FutureWarning (no deepcopy of the pytree specs)
        copy, nodes = kit.copy_for_rewrite(gm)
    nodes[_node(gm, aten.relu.default).name].target = aten.sigmoid.default
    copy.register_buffer("added", torch.ones(1))
    result = kit.finish_rewrite(copy)
    assert [(n.name, n.target, n.args) for n in gm.graph.nodes] == before
    assert gm.code == code and not hasattr(gm, "added")
    assert any(n.target == aten.sigmoid.default for n in result.graph.nodes)
    x = torch.randn(1, 3, 8, 8)
    y = F.conv2d(x, gm.conv.weight, gm.conv.bias, padding="same").mean((2, 3))
    torch.testing.assert_close(
        result(x), torch.sigmoid(F.linear(y, gm.block.linear.weight, gm.block.linear.bias)) * 2.0
    )
    with pytest.raises(TypeError, match="Net"):
        kit.copy_for_rewrite(Net())


def test_reuse_working_copy_rewrites_prepares_copy_in_place_and_copies_anything_else(gm):
    """``copy_for_rewrite(model, reuse_working_copy=True)``: the caller's module is copied as
    without the keyword; the copy prepare hands to ``transform_for_annotation`` is rewritten
    in place, and the prepared module runs the rewritten graph."""
    seen = []

    class Rewriter(qw.Quantizer):
        def transform_for_annotation(self, model):
            result, nodes = kit.copy_for_rewrite(model, reuse_working_copy=True)
            seen.append((model, result))
            nodes[_node(model, aten.relu.default).name].target = aten.sigmoid.default
            return kit.finish_rewrite(result)

        def annotate(self, model):
            return model

    code = gm.code
    direct = Rewriter().transform_for_annotation(gm)
    assert seen[-1][1] is not gm and direct is not gm and gm.code == code  # called directly: a copy
    assert any(n.target == aten.relu.default for n in gm.graph.nodes)
    prepared = qw.prepare_pt2e(gm, Rewriter())
    handed, rewritten = seen[-1]
    assert rewritten is handed and handed is not gm  # prepare's own copy, rewritten in place
    assert gm.code == code and any(n.target == aten.relu.default for n in gm.graph.nodes)
    x = torch.randn(1, 3, 8, 8)
    torch.testing.assert_close(prepared(x), direct(x))  # the sigmoid, in the prepared module's code
    assert "aten.sigmoid" in prepared.code and "aten.relu" not in prepared.code


# -- modules and configs ------------------------------------------------------------------------------


def test_module_paths_types_and_filters(gm):
    linear = _node(gm, aten.linear.default)
    assert "block" in kit.module_paths(linear) and "block.linear" in kit.module_paths(linear)
    assert kit.type_name(torch.nn.Linear) in kit.module_types(linear)
    assert kit.in_module("block")(linear) and not kit.in_module("conv")(linear)
    assert kit.in_module_type(Block)(linear) and not kit.in_module_type(torch.nn.Conv2d)(linear)


def _config():
    return qw.QuantizationConfig(
        qw.QuantizationSpec(torch.uint8, observer_or_fake_quant_ctr=kit.activation_observer()), None, None, None
    )


def test_config_stages_resolve_module_name_then_type_then_operator_then_global(gm):
    g, by_name, by_type, by_op = _config(), _config(), _config(), _config()
    stages = kit.ConfigStages(g)
    stages.set_operator_type(aten.linear.default, by_op)
    stages.set_module_type(Block, by_type)
    stages.set_module_name("block.linear", by_name)
    linear, conv = _node(gm, aten.linear.default), _node(gm, aten.conv2d.padding)
    assert stages.covering(linear).config is by_name
    del stages.module_name["block.linear"]
    assert stages.covering(linear).config is by_type
    stages.module_type.clear()
    assert stages.covering(linear).config is by_op and stages.covering(linear).kind == "operator_type"
    assert stages.covering(conv).config is g and stages.covering(conv).description == "global config"
    stages.set_module_name("conv", None)
    assert stages.covering(conv).config is None and "'conv'" in stages.covering(conv).description
    kinds = [s.kind for s in stages.stages()]
    assert kinds == ["module_name", "operator_type", "global"]
    exclusive = stages.stages()[-1]
    assert not exclusive.accepts(conv) and exclusive.accepts(linear)
    assert stages.stages(exclusive=False)[-1].accepts(conv)
    op_stage = stages.stages()[1]
    assert op_stage.anchors([aten.linear.default]) and not op_stage.anchors([aten.conv2d.default])
    assert stages.configs() == [g, by_op]


def test_config_stages_reject_bad_keys_naming_the_setter():
    stages = kit.ConfigStages()
    with pytest.raises(ValueError, match="set_module_name"):
        stages.set_module_name("", None)
    with pytest.raises(TypeError, match="set_module_type"):
        stages.set_module_type("Linear", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"my_setter.*dict"):
        stages.set_global({}, setter="my_setter")  # type: ignore[arg-type]
    assert [s.kind for s in stages.stages(include_global=False)] == []


def test_config_key_compares_configs_built_alike():
    assert kit.config_key(_config()) == kit.config_key(_config())
    other = qw.QuantizationConfig(
        qw.QuantizationSpec(torch.uint8, observer_or_fake_quant_ctr=kit.activation_observer(is_dynamic=True)),
        None,
        None,
        None,
    )
    assert kit.config_key(other) != kit.config_key(_config())


def test_observer_builders():
    assert kit.activation_observer().p.func is HistogramObserver
    assert kit.activation_observer(is_dynamic=True).p.func is PlaceholderObserver
    assert kit.activation_observer(is_qat=True).p.func.__name__ == "FusedMovingAvgObsFakeQuantize"
    qat_dynamic = kit.activation_observer(is_qat=True, is_dynamic=True).p
    assert qat_dynamic.func.__name__ == "FakeQuantize" and qat_dynamic.keywords["eps"] == 2**-12
    assert kit.weight_observer().p.func is PerChannelMinMaxObserver
    assert kit.weight_observer(per_channel=False).p.func.__name__ == "MinMaxObserver"
    observer = kit.weight_observer(per_channel=False, is_qat=True)()
    assert type(observer).__name__ == "FusedMovingAvgObsFakeQuantize"


# -- reasons and rule tables ---------------------------------------------------------------------------


def test_mark_float_and_explain_float(gm):
    linear, relu = _node(gm, aten.linear.default), _node(gm, aten.relu.default)
    kit.mark_float([linear], "module name 'block' configured None", by="mine")
    assert is_annotated(linear) and "block" in linear.meta[SKIP_REASON_KEY]
    relu.meta[SKIP_REASON_KEY] = "kept: an earlier quantizer's"
    count = kit.explain_float(gm, {"aten.relu.default", "aten.mul.Tensor"}, lambda n: f"{n.name} not matched")
    mul = _node(gm, aten.mul.Tensor)
    assert count == 1 and mul.meta[SKIP_REASON_KEY] == f"{mul.name} not matched"
    assert relu.meta[SKIP_REASON_KEY] == "kept: an earlier quantizer's"


class InPlace(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y += 1
        return y


def test_in_place_reason_names_the_functional_op():
    gm = export(InPlace(), torch.randn(2))
    add_ = _node(gm, aten.add_.Tensor)
    reason = kit.in_place_reason(add_, "x86")
    assert "aten.add.Tensor" in reason and "x86" in reason and "in place" in reason
    assert kit.in_place_reason(_node(gm, aten.mul.Tensor), "x86") is None


def _annotate_linear(model):
    pass


def _annotate_linear_relu(model):
    pass


def _why_relu(node):
    return f"{node.name}: relu is fused only after linear" if node.target == aten.relu.default else None


def _table():
    return kit.RuleTable(
        "mine",
        [
            kit.Rule("linear", _annotate_linear, weighted=True, modes=(Mode.STATIC, Mode.DYNAMIC)),
            kit.Rule("linear_relu", _annotate_linear_relu, _why_relu, weighted=True, fused=True),
            kit.Rule("cat", _annotate_linear, output="shared", input_from="own", option="with_cat"),
            kit.Rule("conv2d_bn", _annotate_linear, weighted=True, output="quantized", modes=(Mode.QAT,)),
        ],
        steps=[_annotate_linear_relu, _annotate_linear],
    )


def test_rule_table_declares_from_its_rows():
    table = _table()
    caps = table.capabilities(Mode.STATIC, ACT, WEIGHT)
    assert [c.pattern for c in caps] == ["linear", "linear_relu"]
    linear, linear_relu = caps
    assert linear.weight == WEIGHT and linear.bias == FLOAT and linear.output == FLOAT and linear.quantizer == "mine"
    assert linear_relu.fused is True
    assert table.patterns(Mode.STATIC, options={"with_cat"}) == ("linear", "linear_relu", "cat")
    (cat,) = [c for c in table.capabilities("static", ACT, WEIGHT, {"with_cat"}) if c.pattern == "cat"]
    assert cat.output == Quant.shared(0) and cat.weight is None and cat.input_from == "own"
    (bn,) = table.capabilities(Mode.QAT, ACT, WEIGHT)
    assert bn.output == Quant.quantized(ACT)
    assert table.patterns(Mode.DYNAMIC) == ("linear",)
    assert {"aten.linear.default", "aten.relu.default", "aten.cat.default"} <= table.ops()


def test_rule_table_runs_each_step_once_in_step_order():
    table = _table()
    assert table.steps_for(Mode.STATIC) == [_annotate_linear_relu, _annotate_linear]
    assert table.steps_for(Mode.DYNAMIC) == [_annotate_linear]
    assert table["linear"].annotate is _annotate_linear
    with pytest.raises(KeyError, match="conv1d"):
        table["conv1d"]


def test_rule_table_reasons_come_from_the_rows(gm):
    table = _table()
    relu = _node(gm, aten.relu.default)
    assert table.reason(relu) == _why_relu(relu)
    assert table.reason(_node(gm, aten.mul.Tensor)) is None
    assert table.explain_float(gm) == 1 and relu.meta[SKIP_REASON_KEY] == _why_relu(relu)


def test_rule_table_refuses_rows_and_steps_that_disagree():
    with pytest.raises(ValueError, match="linear_relu"):
        kit.RuleTable("mine", [kit.Rule("linear_relu", _annotate_linear_relu)], steps=[_annotate_linear])
    with pytest.raises(ValueError, match="_annotate_linear_relu"):
        kit.RuleTable("mine", [kit.Rule("linear", _annotate_linear)], steps=[_annotate_linear, _annotate_linear_relu])
    with pytest.raises(ValueError) as info:
        kit.RuleTable("mine", [kit.Rule("linear"), kit.Rule("linear")])
    assert_names(info, "RuleTable 'mine'", "'linear'", "two rows")
    with pytest.raises(ValueError, match="output"):
        kit.Rule("linear", output="int8")


# -- packaging ------------------------------------------------------------------------------------------


def test_lazy_exports_imports_on_first_use(tmp_path, monkeypatch):
    package = tmp_path / "lazy_pkg_for_test"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from quantweave.authoring import lazy_exports\n"
        "__getattr__, __dir__ = lazy_exports(__name__, {'VALUE': '_impl'})\n"
    )
    (package / "_impl.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lazy_pkg_for_test

    assert "lazy_pkg_for_test._impl" not in sys.modules
    assert dir(lazy_pkg_for_test) == ["VALUE"]
    assert lazy_pkg_for_test.VALUE == 42
    with pytest.raises(AttributeError, match=r"lazy_pkg_for_test.*MISSING"):
        lazy_pkg_for_test.MISSING  # noqa: B018
    with pytest.raises(TypeError, match="lazy_pkg_for_test"):
        kit.lazy_exports("lazy_pkg_for_test", {"X": 1})  # type: ignore[dict-item]


def test_rule_declares_per_mode_notes_per_row_weights_and_no_own_dynamic_output():
    transposed = TensorQuant("int8", -128, 127, "per_channel", symmetric=True, ch_axis=1)
    table = kit.RuleTable(
        "mine",
        [
            kit.Rule(
                "linear",
                modes=(Mode.STATIC, Mode.DYNAMIC),
                weighted=True,
                output="quantized",
                notes={Mode.DYNAMIC: "dynamic: 2-D weights only"},
            ),
            kit.Rule("conv_transpose2d", modes=(Mode.STATIC,), weighted=True),
        ],
    )

    def weight(rule):
        return transposed if rule.pattern == "conv_transpose2d" else WEIGHT

    static = table.capabilities(Mode.STATIC, ACT, weight)
    assert [c.weight for c in static] == [WEIGHT, transposed]
    assert static[0].output == Quant.quantized(ACT) and static[0].notes == ""
    (dynamic,) = table.capabilities(Mode.DYNAMIC, ACT, weight)
    assert dynamic.output == FLOAT and dynamic.notes == "dynamic: 2-D weights only"
    with pytest.raises(ValueError, match="bias"):
        kit.Rule("linear", bias="float")


def test_config_stages_take_a_backends_own_config_class(gm):
    class TableConfig:
        pass

    mine = TableConfig()
    stages = kit.ConfigStages(mine, config_type=TableConfig)
    stages.set_module_type(Block, None)
    assert stages.covering(_node(gm, aten.linear.default)).description == "module type Block"
    assert stages.covering(_node(gm, aten.mul.Tensor)).config is mine
    with pytest.raises(TypeError) as info:
        stages.set_module_name("block", _config())
    assert_names(info, "set_module_name", "TableConfig or None", "QuantizationConfig")


def test_share_inputs_puts_a_concatenation_on_the_owners_range_and_names_a_stranger():
    import torch
    from torch.fx import symbolic_trace

    from quantweave import QuantizationSpec, SharedQuantizationSpec
    from quantweave.authoring import share_inputs
    from quantweave.plugin_api import ANNOTATION_KEY

    class Cat(torch.nn.Module):
        def forward(self, a, b, c):
            return torch.cat([a, b], 1) + c

    gm = symbolic_trace(Cat())
    a, b, c = (n for n in gm.graph.nodes if n.op == "placeholder")
    cat = next(n for n in gm.graph.nodes if n.target is torch.cat)
    from quantweave.observers import MinMaxObserver

    spec = QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=MinMaxObserver, quant_min=0, quant_max=255)
    share_inputs(cat, [a, b], b, spec)
    annotation = cat.meta[ANNOTATION_KEY]
    assert annotation.input_qspec_map[b] is spec
    assert annotation.input_qspec_map[a] == SharedQuantizationSpec((b, cat))
    assert annotation.output_qspec == SharedQuantizationSpec((b, cat))
    with pytest.raises(ValueError) as info:
        share_inputs(cat, [a, b], c, spec)
    assert "'c'" in str(info.value) and "'cat'" in str(info.value)

"""quantweave-litert composes with the first-party plugins: in either order the composed
capability table is what the members really annotate (``check_composition``), and a model
quantized by the composition prepares, calibrates, converts and runs."""

import pytest
import torch
import torch.nn.functional as F
from quantweave_litert import LiteRTQuantizer

import quantweave as qw
from quantweave.plugin_api import ANNOTATED_BY_KEY
from quantweave.testing.conformance import check_composition
from quantweave_x86 import X86InductorQuantizer


def x86():
    return X86InductorQuantizer()


@pytest.mark.parametrize("order", ["litert-first", "x86-first"])
def test_the_composed_capability_table_holds_on_the_probes(order):
    members = [LiteRTQuantizer(), x86()] if order == "litert-first" else [x86(), LiteRTQuantizer()]
    composed = qw.ComposableQuantizer(members)
    assert check_composition(composed) == []
    served = {row.pattern: row.served_by for row in composed.capability_table() if row.mode.value == "static"}
    first = composed.labels[0]
    # patterns both declare go to the first member; the fixed-qparams ones only litert declares
    assert served["conv2d"] == served["linear"] == first
    assert served["sigmoid"] == served["softmax"] == "litert"


def test_each_member_keeps_its_own_patterns_at_a_boundary():
    # x86 (first) claims conv and its pooling (uint8); litert, later, the sigmoid x86 does not declare
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)

        def forward(self, x):
            return torch.sigmoid(F.max_pool2d(self.conv(x), 2))

    x = torch.randn(1, 3, 12, 12)
    exported = torch.export.export(Model().eval(), (x,)).module()
    composed = qw.ComposableQuantizer([x86(), LiteRTQuantizer()])
    prepared = qw.prepare_pt2e(exported, composed)
    by_op = {str(n.target): n.meta.get(ANNOTATED_BY_KEY) for n in prepared.graph.nodes if n.op == "call_function"}
    assert by_op["aten.conv2d.default"] == "x86"
    assert by_op["aten.max_pool2d.default"] == "x86"  # x86 shares through its own pooling
    assert by_op["aten.sigmoid.default"] == "litert"
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    assert converted(x).shape == (1, 8, 5, 5)


def test_a_composed_model_runs_end_to_end_with_both_schemes():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            a = F.relu(self.conv(x))
            return torch.softmax(self.fc(F.adaptive_avg_pool2d(a, 1).flatten(1)), -1)

    x = torch.randn(2, 3, 12, 12)
    model = Model().eval()
    exported = torch.export.export(model, (x,)).module()
    composed = qw.ComposableQuantizer([LiteRTQuantizer(), x86()])
    prepared = qw.prepare_pt2e(exported, composed)
    prepared(x)
    converted = qw.convert_pt2e(prepared, fold_quantize=False)
    torch.testing.assert_close(converted(x), model(x), atol=0.05, rtol=0)
    report = qw.annotation_report(prepared, composed)
    assert "litert" in str(report)

"""annotation_report(..., numerics=compare(...)): the numeric debugger in the report (issue 14)."""

import json
import math

import pytest
import torch
from torch import nn

import quantweave as qw
from quantweave.report import annotation_report
from quantweave.testing.reference import make_reference_quantizer
from quantweave_x86 import X86InductorQuantizer
from tests.helpers import assert_names


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(self.relu(self.conv(x)), 1), 1)
        return torch.sigmoid(self.fc2(self.fc1(x)))


def _batches(count: int = 3) -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, 8, 8, generator=gen),) for _ in range(count)]


def _quantized(quantizer):
    torch.manual_seed(0)
    exported = torch.export.export(Net().eval(), _batches(1)[0]).module()
    prepared = qw.prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for batch in _batches():
            prepared(*batch)
    converted = qw.convert_pt2e(prepared)
    return exported, prepared, converted


@pytest.mark.parametrize("name", ["x86", "reference"])
def test_rows_carry_the_numerics_of_the_nodes_compare_measured(name):
    quantizer = X86InductorQuantizer() if name == "x86" else make_reference_quantizer()
    exported, prepared, converted = _quantized(quantizer)
    numerics = qw.compare(exported, converted, _batches())
    plain = annotation_report(prepared, quantizer)
    report = annotation_report(prepared, quantizer, numerics=numerics)

    # the same rows (numerics do not take part in equality), now with numerics where compared
    assert report.nodes == plain.nodes and not plain.has_numerics and report.has_numerics
    by_node = numerics.by_node()
    compared = [row for row in report.nodes if row.numerics is not None]
    assert compared, "the quantized conv / linears were compared"
    for row in report.nodes:
        if row.node in by_node and by_node[row.node].op == row.op:
            assert row.numerics is by_node[row.node]
            assert row.status == "quantized"  # compare measures ops reading quantized tensors
        else:
            assert row.numerics is None
    listed = {row.node for row in report.nodes}
    assert {node for node, _ in report.numerics_unmatched} == set(by_node) - listed
    for node, reason in report.numerics_unmatched:
        assert "not in the report's pattern vocabulary" in reason, (node, reason)

    # worst first: the compared rows by op SQNR, then the others in graph order
    worst = report.worst_first()
    sqnrs = [row.numerics.sqnr_db for row in worst if row.numerics is not None]
    assert sqnrs == sorted(sqnrs) and len(sqnrs) == len(compared)
    assert [row.node for row in worst[len(sqnrs) :]] == [row.node for row in report.nodes if row.numerics is None]

    table = report.to_table(worst_first=True).splitlines()
    assert table[0].split()[:7] == ["node", "op", "status", "quantizer", "op", "SQNR", "dB"]
    first = worst[0]
    assert table[2].split()[0] == first.node and f"{first.numerics.sqnr_db:.2f}" in table[2]
    assert table[-1].startswith(f"numerics: {len(compared)} node(s) compared on 3 batch(es)")
    limited = report.to_table(worst_first=True, limit=1).splitlines()
    assert limited[2].split()[0] == first.node and limited[3] == f"... {len(report.nodes) - 1} more row(s)"

    data = json.loads(report.to_json())
    rows = {row["node"]: row for row in data["nodes"]}
    for row in compared:
        assert rows[row.node]["numerics"]["sqnr_db"] == pytest.approx(row.numerics.sqnr_db)
        assert rows[row.node]["numerics"]["max_abs_error"] == pytest.approx(row.numerics.max_abs_error)
        assert rows[row.node]["numerics"]["compared_with"] == row.numerics.compared_with
    assert all("numerics" not in rows[row.node] for row in report.nodes if row.numerics is None)
    assert data["summary"]["numerics"]["matched"] == len(compared)
    assert data["summary"]["numerics"]["batches"] == 3
    # without numerics the JSON is what it was
    assert all("numerics" not in row for row in json.loads(plain.to_json())["nodes"])
    assert "numerics" not in json.loads(plain.to_json())["summary"]


def test_an_exact_op_is_inf_in_json_and_table():
    quantizer = make_reference_quantizer()
    exported, prepared, converted = _quantized(quantizer)
    numerics = qw.compare(exported, converted, _batches())
    exact = qw.numerics.OpNumerics(**{**vars(numerics.ops[0]), "sqnr_db": math.inf, "max_abs_error": 0.0})
    patched = qw.numerics.NumericsReport((exact, *numerics.ops[1:]), numerics.unmatched, numerics.batches)
    report = annotation_report(prepared, quantizer, numerics=patched)
    row = next(r for r in report.nodes if r.node == exact.node)
    assert json.loads(report.to_json())["nodes"][report.nodes.index(row)]["numerics"]["sqnr_db"] == "inf"
    assert " inf " in next(line for line in report.to_table().splitlines() if line.startswith(exact.node + " "))


def test_numerics_of_another_model_or_of_the_wrong_type_are_refused():
    quantizer = make_reference_quantizer()
    _, prepared, _ = _quantized(quantizer)
    with pytest.raises(TypeError) as info:
        annotation_report(prepared, quantizer, numerics={"conv2d": 1.0})  # type: ignore[arg-type]
    assert_names(info, "numerics", "quantweave.compare")

    class Other(nn.Module):
        def forward(self, x):
            return torch.matmul(x, x)

    other = torch.export.export(Other(), (torch.randn(4, 4),)).module()
    other_prepared = qw.prepare_pt2e(other, make_reference_quantizer())
    other_prepared(torch.randn(4, 4))
    other_numerics = qw.compare(other, qw.convert_pt2e(other_prepared), [(torch.randn(4, 4),)])
    assert other_numerics.ops
    with pytest.raises(ValueError) as info:
        annotation_report(prepared, quantizer, numerics=other_numerics)
    assert_names(info, "none is a node of this model")


def test_a_node_of_the_same_name_calling_another_op_is_not_matched():
    quantizer = make_reference_quantizer()
    exported, prepared, converted = _quantized(quantizer)
    numerics = qw.compare(exported, converted, _batches())
    target = next(op for op in numerics.ops if op.node == "linear")
    renamed = qw.numerics.OpNumerics(**{**vars(target), "op": "aten.mm.default"})
    patched = qw.numerics.NumericsReport(
        tuple(renamed if op is target else op for op in numerics.ops), numerics.unmatched, numerics.batches
    )
    report = annotation_report(prepared, quantizer, numerics=patched)
    assert next(r for r in report.nodes if r.node == "linear").numerics is None
    reasons = dict(report.numerics_unmatched)
    assert reasons["linear"] == "this model's 'linear' calls aten.linear.default, the compared node aten.mm.default"

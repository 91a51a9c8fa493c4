"""Bad inputs and awkward models through real quantizers (x86, xnnpack): moved from
tests/core/test_bad_inputs.py so that tests/core runs without plugins."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import quantweave as qw
from tests.helpers import Caller, Snapshot, SplitConvLinear, assert_names, clone_inputs


def _flow(caller: Caller, quantizer: Any) -> torch.Tensor:
    prepared = qw.prepare_pt2e(caller.gm, quantizer)
    prepared(*caller.inputs)
    return qw.convert_pt2e(prepared)(*caller.inputs)


def test_what_is_not_an_exported_graph_module_raises_type_error_naming_it():
    model = SplitConvLinear().eval()
    x = torch.randn(1, 3, 8, 8)
    exported_program = torch.export.export(model, (x,))
    for wrong in (model, exported_program):
        with pytest.raises(TypeError) as info:
            qw.prepare_pt2e(wrong, qw.get_quantizer("x86"))
        assert_names(info, "prepare_pt2e", "torch.fx.GraphModule", type(wrong).__name__)
    with pytest.raises(TypeError) as info:
        qw.convert_pt2e(torch.nn.Linear(2, 2))
    assert_names(info, "convert_pt2e", "torch.fx.GraphModule", "Linear")


class BufferUpdate(torch.nn.Module):
    """Updates buffers in forward (a running mean and a call counter)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("running", torch.zeros(4))

    def forward(self, x):
        self.calls.add_(1)
        self.running.mul_(0.9).add_(0.1 * x.detach().mean(0))
        return self.linear(x)


def test_buffers_mutated_in_forward_stay_the_callers():
    """Before (found by this corpus): the prepared model shared the caller's buffers, so
    calibrating it advanced the caller's counter and running mean; running the converted
    model changed the prepared model's. Now each copy updates its own."""
    x = torch.randn(3, 4)
    caller = Caller(BufferUpdate(), x)
    quantizer = qw.get_quantizer("x86")
    prepared = qw.prepare_pt2e(caller.gm, quantizer)
    for _ in range(3):
        prepared(x)
    assert float(prepared.calls) == 3.0
    caller.assert_untouched()
    prepared_snapshot = Snapshot.of(prepared)
    converted = qw.convert_pt2e(prepared)
    out = converted(x)
    assert float(converted.calls) == 4.0
    assert prepared_snapshot.differences(prepared) == []
    assert torch.allclose(out, caller.gm(x.clone()), atol=0.1)


def test_a_training_mode_export_prepared_for_ptq_keeps_the_callers_running_statistics():
    """Batch norm exported in training mode updates its running statistics in forward
    (aten.batch_norm does not declare the write in its schema): calibrating the prepared
    model updates the prepared model's statistics, not the caller's."""

    class ConvBn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv(x))

    x = torch.randn(2, 3, 8, 8)
    gm = torch.export.export(ConvBn().train(), (x,)).module()
    before = Snapshot.of(gm)
    prepared = qw.prepare_pt2e(gm, qw.get_quantizer("x86"))
    prepared(x)
    assert before.differences(gm) == []
    assert float(prepared.state_dict()["bn.running_mean"].abs().sum()) > 0


def test_in_place_ops_give_a_correct_result():
    class InPlace(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            y.relu_()
            y += 1
            return torch.nn.functional.hardtanh(y, inplace=True)

    caller = Caller(InPlace())
    expected = caller.gm(*clone_inputs(caller.inputs))
    out = _flow(caller, qw.get_quantizer("x86"))
    assert torch.allclose(out, expected, atol=0.05)
    caller.assert_untouched()


def test_dynamic_shapes_give_a_correct_result_at_other_batch_sizes():
    batch = torch.export.Dim("batch", min=1, max=16)
    caller = Caller(SplitConvLinear(), torch.randn(2, 3, 8, 8), dynamic_shapes=({0: batch},))
    prepared = qw.prepare_pt2e(caller.gm, qw.get_quantizer("xnnpack"))
    for n in (1, 3, 5):
        prepared(torch.randn(n, 3, 8, 8))
    converted = qw.convert_pt2e(prepared)
    x = torch.randn(7, 3, 8, 8)
    out, expected = converted(x), caller.gm(x)
    assert out.shape == expected.shape == (7, 2)
    assert torch.allclose(out, expected, atol=0.1)
    caller.assert_untouched()


class Outputs(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        z = torch.relu(y)
        if self.kind == "tuple":
            return y, z
        if self.kind == "dict":
            return {"logits": y, "features": z, "nested": [y + 1, (z,)]}
        return [z, y, x]  # an input returned as is


@pytest.mark.parametrize("kind", ["tuple", "dict", "list"])
def test_multiple_outputs_keep_their_structure(kind):
    caller = Caller(Outputs(kind), torch.randn(3, 4))
    expected = caller.gm(*clone_inputs(caller.inputs))
    for name in ("x86", "xnnpack"):
        out = _flow(caller, qw.get_quantizer(name))
        assert type(out) is type(expected)
        flat_out, spec_out = torch.utils._pytree.tree_flatten(out)
        flat_expected, spec_expected = torch.utils._pytree.tree_flatten(expected)
        assert spec_out == spec_expected
        for a, b in zip(flat_out, flat_expected, strict=True):
            assert torch.allclose(a, b, atol=0.1)
    caller.assert_untouched()

"""Bad input to quantweave.calibrate (issue #20): every batch updates every observer or none.

Each case calibrates one good batch, then feeds a bad one, and asserts the exception type,
that the message names what is at fault (the input, the batch, the observer and its node),
and that the observers' state (bit-identical state dicts and Python attributes) and the
model's own weights are exactly what they were before the bad batch. Observer kinds: min/max,
per-channel, histogram, per-group (weights), moving-average, and the fake-quantizers of QAT
(FakeQuantize and the fused FusedMovingAvgObsFakeQuantize).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import quantweave as qw
import quantweave.distributed as qwd
from quantweave.errors import CalibrationInputError, NonFiniteDataError
from quantweave.observers import (
    FakeQuantize,
    FusedMovingAvgObsFakeQuantize,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PerGroupMinMaxObserver,
    is_observer_module,
)
from quantweave.plugin_api import ANNOTATION_KEY
from tests.helpers import assert_names

aten = torch.ops.aten
_INTERNALS = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}


class Net(nn.Module):
    """Two positional inputs and a keyword-only one: x (2, 3, 8, 8), y (2, 6), scale ()."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.lin = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        return (self.conv(x).mean((2, 3)) + self.lin(y)) * scale


def _spec(dtype: torch.dtype, qscheme: torch.qscheme, ctr: Any, ch_axis: int | None = None) -> qw.QuantizationSpec:
    lo, hi = (0, 255) if dtype == torch.uint8 else (-127, 127)
    return qw.QuantizationSpec(
        dtype=dtype, quant_min=lo, quant_max=hi, qscheme=qscheme, ch_axis=ch_axis, observer_or_fake_quant_ctr=ctr
    )


class WeightedOps(qw.Quantizer):
    """Input, weight and output of every conv2d / linear (``linear_weight``: another spec
    for the linear's weight)."""

    def __init__(
        self, act: qw.QuantizationSpec, weight: qw.QuantizationSpec, linear_weight: qw.QuantizationSpec | None = None
    ) -> None:
        self.act, self.weight, self.linear_weight = act, weight, linear_weight or weight

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        for node in model.graph.nodes:
            if node.target in (aten.conv2d.default, aten.linear.default):
                weight = self.linear_weight if node.target == aten.linear.default else self.weight
                node.meta[ANNOTATION_KEY] = qw.QuantizationAnnotation(
                    input_qspec_map={node.args[0]: self.act, node.args[1]: weight},
                    output_qspec=self.act,
                    _annotated=True,
                )
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        return None


U8, I8 = torch.uint8, torch.int8
PER_CHANNEL_W = _spec(I8, torch.per_channel_symmetric, PerChannelMinMaxObserver, ch_axis=0)
KINDS: dict[str, tuple[qw.QuantizationSpec, qw.QuantizationSpec, bool]] = {
    "minmax": (_spec(U8, torch.per_tensor_affine, MinMaxObserver), PER_CHANNEL_W, False),
    "per_channel": (
        _spec(U8, torch.per_channel_affine, PerChannelMinMaxObserver.with_args(ch_axis=1), ch_axis=1),
        PER_CHANNEL_W,
        False,
    ),
    "histogram": (_spec(U8, torch.per_tensor_affine, HistogramObserver), PER_CHANNEL_W, False),
    # the linear's weight (4 x 6) in groups of 2: PerGroupMinMaxObserver replaces its buffers
    "per_group": (_spec(U8, torch.per_tensor_affine, MinMaxObserver), PER_CHANNEL_W, False),
    "moving_average": (
        _spec(U8, torch.per_tensor_affine, MovingAverageMinMaxObserver),
        _spec(I8, torch.per_channel_symmetric, MovingAveragePerChannelMinMaxObserver, ch_axis=0),
        False,
    ),
    "qat_fake_quant": (
        _spec(U8, torch.per_tensor_affine, FakeQuantize.with_args(observer=MovingAverageMinMaxObserver)),
        _spec(
            I8,
            torch.per_channel_symmetric,
            FakeQuantize.with_args(observer=MovingAveragePerChannelMinMaxObserver, ch_axis=0),
            ch_axis=0,
        ),
        True,
    ),
    "qat_fused": (
        _spec(U8, torch.per_tensor_affine, FusedMovingAvgObsFakeQuantize),
        _spec(
            I8,
            torch.per_channel_symmetric,
            FusedMovingAvgObsFakeQuantize.with_args(observer=MovingAveragePerChannelMinMaxObserver, ch_axis=0),
            ch_axis=0,
        ),
        True,
    ),
}


LINEAR_WEIGHT = {
    "per_group": qw.QuantizationSpec(
        dtype=torch.int8,
        quant_min=-8,
        quant_max=7,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        group_size=2,
        observer_or_fake_quant_ctr=PerGroupMinMaxObserver,
    )
}


def inputs(seed: int = 0, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, 8, 8, generator=g), torch.randn(batch, 6, generator=g), torch.tensor(1.5)


@functools.cache
def exported_net(train: bool, dynamic: bool) -> torch.fx.GraphModule:
    """Exported once per mode (prepare never mutates it: it works on a copy)."""
    torch.manual_seed(0)
    model = Net().train() if train else Net().eval()
    x, y, scale = inputs()
    shapes = None
    if dynamic:
        batch = torch.export.Dim("batch")
        shapes = {"x": {0: batch}, "y": {0: batch}, "scale": None}
    return torch.export.export(model, (x, y), {"scale": scale}, dynamic_shapes=shapes).module()


def prepared_net(kind: str, dynamic: bool = False) -> torch.fx.GraphModule:
    act, weight, qat = KINDS[kind]
    exported = exported_net(qat, dynamic)
    prepare = qw.prepare_qat_pt2e if qat else qw.prepare_pt2e
    prepared = prepare(exported, WeightedOps(act, weight, LINEAR_WEIGHT.get(kind)))
    qw.calibrate(prepared, [good(1)], progress=False)  # a state to keep
    return prepared


def good(seed: int) -> tuple[torch.Tensor, ...]:
    return inputs(seed)


def snapshot(prepared: torch.fx.GraphModule) -> dict[str, Any]:
    """Everything calibration may touch: the whole state dict (observers and the model's own
    tensors) and the observers' Python attributes."""
    state = {k: v.detach().clone() for k, v in prepared.state_dict(keep_vars=True).items()}
    attributes = {
        name: {k: v for k, v in vars(module).items() if k not in _INTERNALS}
        for name, module in prepared.named_modules()
        if is_observer_module(module) or isinstance(getattr(module, "min_val", None), torch.Tensor)
    }
    return {"state": state, "attributes": attributes}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t


def assert_unchanged(prepared: torch.fx.GraphModule, before: dict[str, Any], attributes: bool = True) -> None:
    """The state dict bit for bit; with ``attributes``, the observers' Python attributes
    (the same objects or equal values: only meaningful against the same model)."""
    after = snapshot(prepared)
    assert after["state"].keys() == before["state"].keys()
    for key, value in before["state"].items():
        got = after["state"][key]
        assert got.dtype == value.dtype and got.shape == value.shape, key
        assert torch.equal(_bits(got), _bits(value)), key
    if not attributes:
        return
    assert after["attributes"].keys() == before["attributes"].keys()
    for name, attrs in before["attributes"].items():
        assert after["attributes"][name].keys() == attrs.keys(), name
        for key, value in attrs.items():
            got = after["attributes"][name][key]
            assert got is value or got == value, f"{name}.{key}"


def observer_names(prepared: torch.fx.GraphModule) -> set[str]:
    return {n.target for n in prepared.graph.nodes if n.op == "call_module" and n.target != "_guards_fn"}


def _with(value: float, which: int) -> tuple[torch.Tensor, ...]:
    batch = list(good(2))
    batch[which] = batch[which].clone()
    batch[which].view(-1)[3] = value
    return tuple(batch)


# -- batches that do not match the exported program ------------------------------------------------

x, y, scale = inputs(3)
MISMATCHES = {
    # case: (batch, what the message must name)
    "wrong channel count": (
        (torch.randn(2, 4, 8, 8), y, scale),
        ["'x'", "positional input 0", "dimension 1", "3", "4"],
    ),
    "wrong spatial size": ((torch.randn(2, 3, 9, 9), y, scale), ["'x'", "dimension 2", "8", "9"]),
    "float64": ((x.double(), y, scale), ["'x'", "torch.float32", "torch.float64"]),
    "int batch": ((x, torch.randint(0, 9, (2, 6)), scale), ["'y'", "positional input 1", "torch.int64"]),
    "wrong number of inputs": ((x,), ["(x, y, *, scale)", "missing", "'y'", "1 positional"]),
    "kwargs mismatch": ({"x": x, "y": y, "scal": scale}, ["'scal'", "'scale'", "unexpected"]),
    "wrong rank": ((x[0], y, scale), ["'x'", "4 dimensions", "3"]),
    "not a tensor": ((x, y.tolist(), scale), ["'y'", "list"]),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_a_batch_the_program_rejects_changes_no_observer(kind: str, case: str) -> None:
    prepared = prepared_net(kind)
    batch, named = MISMATCHES[case]
    after_batch_0: list[dict[str, Any]] = []
    with pytest.raises(CalibrationInputError) as info:  # batch 1 is the bad one
        qw.calibrate(prepared, [good(4), batch], progress=lambda done, total: after_batch_0.append(snapshot(prepared)))
    message = str(info.value)
    assert "batch 1" in message
    for word in named:
        assert word in message, (word, message)
    assert_unchanged(prepared, after_batch_0[-1])
    # and that is the state of calibrating batch 0 alone
    reference = prepared_net(kind)
    qw.calibrate(reference, [good(4)], progress=False)
    assert_unchanged(prepared, snapshot(reference), attributes=False)


@pytest.mark.parametrize("kind", ["minmax", "histogram", "qat_fused"])
def test_the_first_batch_rejected_leaves_the_state_as_prepared(kind: str) -> None:
    prepared = prepared_net(kind)
    before = snapshot(prepared)
    with pytest.raises(CalibrationInputError) as info:
        qw.calibrate(prepared, [(x.double(), y, scale)], progress=False)
    assert_names(info, "batch 0", "'x'")
    assert_unchanged(prepared, before)


def test_dynamic_dimensions_must_agree_between_inputs() -> None:
    prepared = prepared_net("minmax", dynamic=True)
    qw.calibrate(prepared, [inputs(5, batch=3), inputs(6, batch=1)], progress=False)  # other batch sizes: fine
    before = snapshot(prepared)
    x3, _, s = inputs(7, batch=3)
    _, y2, _ = inputs(7, batch=2)
    with pytest.raises(CalibrationInputError) as info:
        qw.calibrate(prepared, [(x3, y2, s)], progress=False)
    message = str(info.value)
    assert "'y'" in message and "'x' dimension 0" in message and "expected 3, got 2" in message
    assert_unchanged(prepared, before)


# -- non-finite values ------------------------------------------------------------------------------

NON_FINITE = {
    "NaN in x": (float("nan"), 0, "'x'"),
    "+inf in y": (float("inf"), 1, "'y'"),
    "-inf in x": (float("-inf"), 0, "'x'"),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", list(NON_FINITE))
def test_non_finite_values_are_refused_naming_observer_node_and_batch(kind: str, case: str) -> None:
    value, which, node = NON_FINITE[case]
    prepared = prepared_net(kind)
    after_batch_0: list[dict[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's HistogramObserver warns about infinities
        with pytest.raises(NonFiniteDataError) as info:
            qw.calibrate(
                prepared,
                [good(4), _with(value, which), good(5)],
                progress=lambda done, total: after_batch_0.append(snapshot(prepared)),
            )
    message = str(info.value)
    assert "batch 1" in message and f"observes node {node}" in message, message
    assert any(f"observer {name!r}" in message for name in observer_names(prepared)), message
    assert len(after_batch_0) == 1
    assert_unchanged(prepared, after_batch_0[0])
    reference = prepared_net(kind)
    qw.calibrate(reference, [good(4)], progress=False)
    assert_unchanged(prepared, snapshot(reference), attributes=False)


@pytest.mark.parametrize("kind", ["minmax", "histogram", "qat_fake_quant"])
def test_skip_policy_skips_the_batch_with_a_warning_and_a_count(kind: str) -> None:
    prepared = prepared_net(kind)
    with pytest.warns(RuntimeWarning) as caught:
        result = qw.calibrate(prepared, [good(4), _with(float("nan"), 0), good(5)], progress=False, non_finite="skip")
    assert_names(caught, "batch 1", "NaN")
    assert result.skipped == (1,) and result.batches == 2
    assert "1 skipped (non-finite values)" in str(result)
    reference = prepared_net(kind)
    qw.calibrate(reference, [good(4), good(5)], progress=False)  # the same as never seeing batch 1
    assert_unchanged(prepared, snapshot(reference), attributes=False)


def test_an_unknown_non_finite_policy_is_named() -> None:
    prepared = prepared_net("minmax")
    with pytest.raises(ValueError) as info:
        qw.calibrate(prepared, [good(4)], non_finite="ignore")
    assert_names(info, "non_finite", "'error'", "'skip'", "'ignore'")


# -- a forward that fails anyway ---------------------------------------------------------------------


def _output_observer(prepared: torch.fx.GraphModule) -> str:
    """The observer of the linear's output (it runs after the observers of x, y, the
    weights and the conv)."""
    (linear,) = [n for n in prepared.graph.nodes if n.target == aten.linear.default]
    (user,) = linear.users
    return str(user.target)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_forward_failing_midway_restores_every_observer(kind: str) -> None:
    prepared = prepared_net(kind)
    before = snapshot(prepared)
    name = _output_observer(prepared)
    module = prepared.get_submodule(name)

    def broken(x_orig: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("observer exploded")

    module.forward = broken  # instance attribute: the observers before it have run
    with pytest.raises(RuntimeError, match="observer exploded") as info:
        qw.calibrate(prepared, [good(4)], progress=False)
    del module.forward
    note = " ".join(getattr(info.value, "__notes__", []))
    assert "batch 0 failed" in note and f"observer {name!r}" in note and "restored" in note, note
    assert_unchanged(prepared, before)


# -- misuse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batches", "named"),
    [(5, "got int"), (None, "got None"), (torch.randn(3, 4), "wrap one batch in a list")],
)
def test_batches_that_are_not_an_iterable_of_batches(batches: Any, named: str) -> None:
    prepared = prepared_net("minmax")
    before = snapshot(prepared)
    with pytest.raises(TypeError) as info:
        qw.calibrate(prepared, batches)
    assert_names(info, "batches", "iterable")
    assert named in str(info.value)
    assert_unchanged(prepared, before)


def test_a_none_batch_is_named() -> None:
    prepared = prepared_net("histogram")
    with pytest.raises(TypeError) as info:
        qw.calibrate(prepared, [good(4), None], progress=False)
    assert_names(info, "batch 1", "None")
    reference = prepared_net("histogram")
    qw.calibrate(reference, [good(4)], progress=False)
    assert_unchanged(prepared, snapshot(reference), attributes=False)


# -- the distributed path ------------------------------------------------------------------------------


def range_states(prepared: torch.fx.GraphModule) -> dict[str, tuple[float, float, int]]:
    found = {}
    for name, module in prepared.named_modules():
        recorder = vars(module).get("forward")
        if isinstance(module, HistogramObserver) and recorder is not None:
            found[name] = (float(recorder.min_val), float(recorder.max_val), recorder.non_finite_batches)
    return found


@pytest.mark.parametrize("bad", ["float64", "NaN", "failure"])
def test_range_pass_batches_are_transactional_too(bad: str) -> None:
    exported = exported_net(False, False)
    act, weight, _ = KINDS["histogram"]
    prepared = qw.prepare_pt2e(exported, WeightedOps(act, weight))
    reference = qw.prepare_pt2e(exported, WeightedOps(act, weight))
    with qwd.range_pass(reference):
        qw.calibrate(reference, [good(4)], progress=False)
        expected = range_states(reference)
    with qwd.range_pass(prepared):
        qw.calibrate(prepared, [good(4)], progress=False)
        before = snapshot(prepared)
        batch = {"float64": (x.double(), y, scale), "NaN": _with(float("nan"), 0), "failure": good(6)}[bad]
        module = prepared.get_submodule(_output_observer(prepared))
        recorder = vars(module)["forward"]  # range_pass's stand-in for the histogram
        if bad == "failure":  # fails after the observers of x, y and the conv recorded the batch
            module.forward = lambda x_orig: (_ for _ in ()).throw(RuntimeError("boom"))
        with pytest.raises((CalibrationInputError, NonFiniteDataError, RuntimeError)) as info:
            qw.calibrate(prepared, [batch], progress=False)
        module.forward = recorder
        assert "batch 0" in str(info.value) + " ".join(getattr(info.value, "__notes__", []))
        assert range_states(prepared) == expected  # the recorded ranges: as if the batch never came
        assert_unchanged(prepared, before)
    qw.calibrate(prepared, [good(4)], progress=False)
    qw.calibrate(reference, [good(4)], progress=False)
    qwd.sync_observers(prepared)
    qwd.sync_observers(reference)
    assert_unchanged(prepared, snapshot(reference), attributes=False)

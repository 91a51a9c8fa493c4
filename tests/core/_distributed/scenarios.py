"""Models, data, quantizers and scenarios shared by ``tests/core/test_distributed.py`` and the
worker processes it launches (``worker.py``). Every rank and the single-process references
build exactly the same models and batches from these functions."""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import quantweave as qw
from quantweave.distributed import DistributedSyncError, range_pass, sync_observers
from quantweave.observers import (
    FakeQuantize,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
)
from quantweave.plugin_api import ANNOTATION_KEY
from quantweave.testing.models import calibration_batches, example_inputs, resnet18_like
from quantweave.testing.reference import activation_spec, make_reference_quantizer, quantweave_api, weight_spec

aten = torch.ops.aten
WORLD = 2
#: bounds every wait of a synchronization in the happy-path scenarios
SYNC_TIMEOUT = 30.0
#: bounds the join in the failure launches: the surviving rank must raise within it
FAIL_TIMEOUT = 3.0
BATCHES = 8

# -- models and data ------------------------------------------------------------------------------


def resnet() -> nn.Module:
    """ResNet-18's topology with one basic block per stage, narrow: 29 activation observers."""
    return resnet18_like(blocks=(1, 1, 1, 1), width=8, num_classes=10)


def resnet_batches() -> list[tuple[torch.Tensor, ...]]:
    return calibration_batches(resnet(), BATCHES, batch=2, image=32)


def shard(batches: list[Any], rank: int, world: int = WORLD) -> list[Any]:
    """Rank ``rank``'s shard, interleaved as ``DistributedSampler(shuffle=False)`` deals it."""
    return batches[rank::world]


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def small_net() -> nn.Module:
    torch.manual_seed(5)
    return SmallNet()


def small_batches(count: int = 6, seed: int = 11) -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(seed)
    # the scale grows with the index, so every batch moves the ranges
    return [(torch.randn(2, 3, 8, 8, generator=gen) * (1 + i),) for i in range(count)]


class WeightedOpQuantizer(qw.Quantizer):
    """Input, weight and output of every conv2d / linear, with the given constructors."""

    def __init__(self, act: Callable[..., Any], weight: Callable[..., Any]) -> None:
        self.act = activation_spec(quantweave_api(), act)
        self.weight = weight_spec(quantweave_api(), weight, narrow=True)

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        for node in model.graph.nodes:
            if node.target in (aten.conv2d.default, aten.linear.default):
                node.meta[ANNOTATION_KEY] = qw.QuantizationAnnotation(
                    input_qspec_map={node.args[0]: self.act, node.args[1]: self.weight},
                    output_qspec=self.act,
                    _annotated=True,
                )
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        return None


class CountingObserver(ObserverBase):
    """A plugin-style observer quantweave.distributed does not know how to merge."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(dtype=kwargs.get("dtype", torch.quint8))
        self.register_buffer("min_val", torch.tensor(float("inf")))
        self.register_buffer("max_val", torch.tensor(float("-inf")))
        self.quant_min, self.quant_max = kwargs.get("quant_min", 0), kwargs.get("quant_max", 255)
        self.qscheme = kwargs.get("qscheme", torch.per_tensor_affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.min_val.copy_(torch.minimum(self.min_val, x.min()))
        self.max_val.copy_(torch.maximum(self.max_val, x.max()))
        return x

    def calculate_qparams(self) -> Any:  # type: ignore[override]
        return torch.tensor([1.0]), torch.tensor([0])


class OverridingMinMax(MinMaxObserver):
    """Subclasses MinMaxObserver but changes what its state means: refused."""

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        return super().forward(x_orig.abs())


MOVING = (
    MovingAverageMinMaxObserver.with_args(averaging_constant=0.5),
    MovingAveragePerChannelMinMaxObserver.with_args(averaging_constant=0.5),
)
QAT = (
    FakeQuantize.with_args(observer=MinMaxObserver),
    FakeQuantize.with_args(observer=PerChannelMinMaxObserver),
)


@functools.cache
def exported_resnet() -> torch.fx.GraphModule:
    model = resnet()
    return torch.export.export(model, example_inputs(model, batch=2)).module()


def prepared_resnet(histogram: bool) -> torch.fx.GraphModule:
    # prepare_pt2e leaves the exported module as it was, so one export serves every prepare
    return qw.prepare_pt2e(exported_resnet(), make_reference_quantizer(histogram=histogram))


@functools.cache
def exported_small(qat: bool) -> torch.fx.GraphModule:
    model = small_net()
    return torch.export.export(model.train() if qat else model.eval(), small_batches(1)[0]).module()


def prepared_small(act: Callable[..., Any], weight: Callable[..., Any], qat: bool = False) -> torch.fx.GraphModule:
    if qat:
        return qw.prepare_qat_pt2e(exported_small(True), WeightedOpQuantizer(act, weight))
    return qw.prepare_pt2e(exported_small(False), WeightedOpQuantizer(act, weight))


def calibrate(prepared: torch.fx.GraphModule, batches: list[Any]) -> None:
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)


def two_pass(prepared: torch.fx.GraphModule, batches: list[Any], timeout: float | None = SYNC_TIMEOUT) -> None:
    with range_pass(prepared, timeout=timeout):
        calibrate(prepared, batches)
    calibrate(prepared, batches)


# -- what the tests compare ------------------------------------------------------------------------


def observer_modules(prepared: torch.fx.GraphModule) -> dict[str, nn.Module]:
    return {name: m for name, m in prepared.named_children() if name.startswith("activation_post_process_")}


def inner(module: nn.Module) -> Any:
    return getattr(module, "activation_post_process", module)


def states(prepared: torch.fx.GraphModule) -> dict[str, dict[str, torch.Tensor]]:
    """Every buffer of every observer (fake-quantizers: theirs and their observer's)."""
    return {
        name: {k: v.detach().clone() for k, v in module.state_dict().items()}
        for name, module in observer_modules(prepared).items()
    }


def qparams(prepared: torch.fx.GraphModule) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(scale, zero point) of every observer that saw data."""
    out = {}
    for name, module in observer_modules(prepared).items():
        if qw.observers.is_calibrated(module):
            scale, zero_point = module.calculate_qparams()
            out[name] = (scale.detach().clone(), zero_point.detach().clone())
    return out


def clip_bins(prepared: torch.fx.GraphModule) -> dict[str, tuple[float, float]]:
    """Where each HistogramObserver's search clips, in bins of its final histogram."""
    out = {}
    for name, module in observer_modules(prepared).items():
        if isinstance(module, HistogramObserver) and qw.observers.is_calibrated(module):
            lo, hi = module.search_min_max()
            width = float(module.max_val - module.min_val) / module.bins
            out[name] = ((float(lo) - float(module.min_val)) / width, (float(hi) - float(module.min_val)) / width)
    return out


def summary_dict(summary: Any) -> dict[str, Any]:
    return {**dataclasses.asdict(summary), "exact": summary.exact}


def probe_output(prepared: torch.fx.GraphModule) -> torch.Tensor:
    converted = qw.convert_pt2e(prepared)
    return converted(*example_inputs(resnet(), batch=2)).detach()


# -- the scenarios of the main launch (run in this order on every rank) ----------------------------


def _error(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


def scenario_minmax(rank: int) -> dict[str, Any]:
    prepared = prepared_resnet(histogram=False)
    calibrate(prepared, shard(resnet_batches(), rank))
    summary = sync_observers(prepared, timeout=SYNC_TIMEOUT)
    return {"summary": summary_dict(summary), "states": states(prepared), "output": probe_output(prepared)}


def scenario_histogram(rank: int) -> dict[str, Any]:
    prepared = prepared_resnet(histogram=True)
    calibrate(prepared, shard(resnet_batches(), rank))
    summary = sync_observers(prepared, timeout=SYNC_TIMEOUT)
    return {"summary": summary_dict(summary), "qparams": qparams(prepared), "clip": clip_bins(prepared)}


def scenario_histogram_range_pass(rank: int) -> dict[str, Any]:
    prepared = prepared_resnet(histogram=True)
    two_pass(prepared, shard(resnet_batches(), rank))
    summary = sync_observers(prepared, timeout=SYNC_TIMEOUT)
    return {"summary": summary_dict(summary), "qparams": qparams(prepared), "states": states(prepared)}


def scenario_moving_average(rank: int) -> dict[str, Any]:
    prepared = prepared_small(*MOVING)
    calibrate(prepared, small_batches()[:3] if rank == 0 else small_batches()[3:4])  # 3 batches vs 1
    before = states(prepared)
    summary = sync_observers(prepared, timeout=SYNC_TIMEOUT)
    return {"summary": summary_dict(summary), "before": before, "states": states(prepared)}


def scenario_empty_rank(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("minmax", "histogram"):
        prepared = prepared_resnet(histogram=kind == "histogram")
        calibrate(prepared, shard(resnet_batches(), 0) if rank == 0 else [])
        summary = sync_observers(prepared, timeout=SYNC_TIMEOUT)
        out[kind] = {"summary": summary_dict(summary), "states": states(prepared)}
    return out


def scenario_nowhere(rank: int) -> dict[str, Any]:
    prepared = prepared_small(MinMaxObserver, PerChannelMinMaxObserver)
    names = list(observer_modules(prepared))
    fed = "activation_post_process_0"
    if rank == 0:
        observer_modules(prepared)[fed](torch.tensor([-1.0, 3.0]))
    summary = sync_observers(prepared, timeout=SYNC_TIMEOUT)
    try:
        qw.convert_pt2e(prepared)
        convert_error = None
    except Exception as exc:
        convert_error = _error(exc)
    return {
        "summary": summary_dict(summary),
        "names": names,
        "fed": fed,
        "fed_state": states(prepared)[fed],
        "convert_error": convert_error,
    }


def _expect_sync_error(prepared: torch.fx.GraphModule) -> dict[str, Any]:
    before = states(prepared)
    start = time.perf_counter()
    try:
        sync_observers(prepared, timeout=SYNC_TIMEOUT)
        error = None
    except DistributedSyncError as exc:
        error = _error(exc)
    return {
        "error": error,
        "seconds": time.perf_counter() - start,
        "unchanged": _same(before, states(prepared)),
    }


def _same(a: dict[str, dict[str, torch.Tensor]], b: dict[str, dict[str, torch.Tensor]]) -> bool:
    return a.keys() == b.keys() and all(
        a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]) for n in a
    )


def scenario_mismatch(rank: int) -> dict[str, Any]:
    prepared = prepared_small(MinMaxObserver, PerChannelMinMaxObserver)
    if rank == 1:  # another quantizer on one rank: the same observer names, other classes
        prepared = prepared_small(HistogramObserver, PerChannelMinMaxObserver)
    calibrate(prepared, small_batches()[rank::2])
    return _expect_sync_error(prepared)


def scenario_unsupported(rank: int) -> dict[str, Any]:
    out = {}
    for label, ctr in (("plugin_observer", CountingObserver), ("overriding_subclass", OverridingMinMax)):
        prepared = prepared_small(ctr, PerChannelMinMaxObserver)
        calibrate(prepared, small_batches()[rank::2])
        out[label] = _expect_sync_error(prepared)
    return out


def scenario_local_failure(rank: int) -> dict[str, Any]:
    prepared = prepared_small(HistogramObserver, PerChannelMinMaxObserver)
    calibrate(prepared, small_batches()[rank::2])
    if rank == 1:  # a corrupt observer on one rank only: found while building its inventory
        observer_modules(prepared)["activation_post_process_0"].histogram.resize_(7)
    return _expect_sync_error(prepared)


def scenario_failure_while_merging(rank: int) -> dict[str, Any]:
    """Rank 0 fails after the first all-reduce, while re-binning its histograms (its shard
    has the smaller values, so its ranges are the ones to widen): every rank raises at the
    second all-reduce, nothing is written, and the group stays usable."""
    import quantweave.distributed as qwd

    prepared = prepared_small(HistogramObserver, PerChannelMinMaxObserver)
    calibrate(prepared, small_batches()[rank::2])  # the ranks' ranges differ: re-binning runs
    original = qwd.rebin_histogram

    def broken(*args: Any) -> torch.Tensor:
        raise RuntimeError("rebin failed on purpose")

    if rank == 0:
        qwd.rebin_histogram = broken  # type: ignore[assignment]
    try:
        return _expect_sync_error(prepared)
    finally:
        qwd.rebin_histogram = original  # type: ignore[assignment]


def scenario_qat(rank: int) -> dict[str, Any]:
    prepared = prepared_small(*QAT, qat=True)
    for batch in small_batches()[rank::2]:
        prepared(*batch)  # training-mode forward: the fake-quantizers observe
    summary = sync_observers(prepared, timeout=SYNC_TIMEOUT)
    return {"summary": summary_dict(summary), "states": states(prepared)}


def scenario_usable_after_errors(rank: int) -> dict[str, Any]:
    prepared = prepared_small(MinMaxObserver, PerChannelMinMaxObserver)
    calibrate(prepared, small_batches()[rank::2])
    summary = sync_observers(prepared, timeout=SYNC_TIMEOUT)
    return {"summary": summary_dict(summary), "states": states(prepared)}


MAIN = {
    name.removeprefix("scenario_"): fn
    for name, fn in globals().items()
    if name.startswith("scenario_") and callable(fn)
}

# -- the failure launches (the process group is not reusable afterwards) ---------------------------


def failure(rank: int, mode: str) -> dict[str, Any]:
    """Rank 1 exits as a crash during calibration would (``dead``), or stays alive but never
    calls ``sync_observers`` (``late``); rank 0 calibrates and synchronizes."""
    if rank == 1:
        if mode == "dead":
            os._exit(3)
        time.sleep(FAIL_TIMEOUT + 30)  # the test ends it once rank 0 is done
        os._exit(0)
    prepared = prepared_small(MinMaxObserver, PerChannelMinMaxObserver)
    calibrate(prepared, small_batches()[::2])
    before = states(prepared)
    start = time.perf_counter()
    try:
        sync_observers(prepared, timeout=FAIL_TIMEOUT)
        error = None
    except DistributedSyncError as exc:
        error = _error(exc)
    return {"error": error, "seconds": time.perf_counter() - start, "unchanged": _same(before, states(prepared))}

"""quantweave.distributed: observers synchronized across 2 real processes (gloo, CPU).

Every multi-process test launches 2 workers (``tests/core/_distributed/worker.py``) on a
free port of 127.0.0.1, each launch bounded by ``LAUNCH_TIMEOUT``; the single-process
references are computed here, from the same model, quantizer and batches
(``tests/core/_distributed/scenarios.py``). One launch runs every happy-path and
validation-failure scenario in turn on one process group; a rank that dies and a rank that
never arrives get a launch each (the group is broken afterwards).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import quantweave as qw
from quantweave.distributed import DistributedSyncError, SyncSummary, range_pass, sync_observers
from quantweave.errors import ObserverNotCalibratedError
from tests.core._distributed import scenarios as S
from tests.helpers import assert_names

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT = 180  # seconds, per launch of 2 processes (a hang fails the test, never the suite)
#: the Histogram bound stated in docs/distributed.md: each end of the merged clipping range
#: within this many of the 2048 bins of the union range of the one-process clipping range
HISTOGRAM_BOUND_BINS = 128
#: the tests that launch processes: marked slow, they run in the tox env slow
multi_process = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(kind: str, out: Path, world: int = S.WORLD) -> list[dict[str, Any]]:
    """Run every rank of a launch; their results, rank by rank. In the failure launch only
    rank 0 synchronizes (and writes a result): it is waited for, then the others are ended.
    Retried once on a new port if another process took the free port first."""
    ranks = range(world) if kind == "main" else range(1)
    for attempt in range(2):
        logs = _run_ranks(kind, out, world, len(ranks))
        if attempt == 0 and any("Address already in use" in log for log in logs):
            for rank in range(world):
                (out / f"rank{rank}.pt").unlink(missing_ok=True)
            continue
        break
    results = []
    for rank in ranks:
        path = out / f"rank{rank}.pt"
        assert path.exists(), f"rank {rank} wrote no result:\n{logs[rank][-3000:] if rank < len(logs) else ''}"
        result = torch.load(path, weights_only=False)
        assert "crash" not in result, f"rank {rank} crashed:\n{result['crash']}"
        results.append(result)
    return results


def _run_ranks(kind: str, out: Path, world: int, waited: int) -> list[str]:
    """Start ``world`` workers, wait for the first ``waited`` (bounded), end the rest; their logs."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(world),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "tests.core._distributed.worker", "--launch", kind, "--out", str(out)]
    procs = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    logs = []
    try:
        for proc in procs[:waited]:
            logs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"launch {kind!r} did not finish within {LAUNCH_TIMEOUT} s (a hang)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    return logs


@pytest.fixture(scope="module")
def main(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return launch("main", tmp_path_factory.mktemp("main"))


def assert_same_states(
    actual: dict[str, dict[str, torch.Tensor]], expected: dict[str, dict[str, torch.Tensor]]
) -> None:
    assert actual.keys() == expected.keys() and expected
    for name, buffers in expected.items():
        assert actual[name].keys() == buffers.keys(), name
        for key, value in buffers.items():
            assert torch.equal(actual[name][key], value), f"{name}.{key}: {actual[name][key]} != {value}"


def one_process(prepared: torch.fx.GraphModule, batches: list[Any]) -> torch.fx.GraphModule:
    S.calibrate(prepared, batches)
    return prepared


# -- exact kinds ----------------------------------------------------------------------------------


@multi_process
def test_minmax_and_per_channel_equal_one_process_on_the_union(main):
    reference = one_process(S.prepared_resnet(histogram=False), S.resnet_batches())
    expected_output = S.probe_output(reference)
    for rank in range(S.WORLD):
        result = main[rank]["minmax"]
        assert_same_states(result["states"], S.states(reference))
        assert torch.equal(result["output"], expected_output)  # each rank converts to the same model
        summary = result["summary"]
        assert summary["world_size"] == 2 and summary["exact"]
        assert summary["merged"] == {"minmax": 22, "per_channel_minmax": 13}
    assert main[0]["minmax"]["summary"]["payload_bytes"] == main[1]["minmax"]["summary"]["payload_bytes"]


@multi_process
def test_histogram_after_range_pass_equals_one_process_running_the_same_two_passes(main):
    reference = S.prepared_resnet(histogram=True)
    S.two_pass(reference, S.resnet_batches())  # one process: range pass, then calibration, on the union
    for rank in range(S.WORLD):
        result = main[rank]["histogram_range_pass"]
        assert_same_states(result["states"], S.states(reference))  # histograms bit for bit
        expected = S.qparams(reference)
        assert result["qparams"].keys() == expected.keys() and len(expected) == 35
        for name, (scale, zero_point) in expected.items():
            assert torch.equal(result["qparams"][name][0], scale) and torch.equal(
                result["qparams"][name][1], zero_point
            )
        assert result["summary"]["exact"] and result["summary"]["rebinned"] == ()


@multi_process
def test_histogram_one_pass_is_within_the_stated_bound_of_one_process(main):
    reference = one_process(S.prepared_resnet(histogram=True), S.resnet_batches())
    expected_clip, expected_qparams = S.clip_bins(reference), S.qparams(reference)
    first = main[0]["histogram"]
    assert first["summary"]["rebinned"], "the shards' ranges differ: the approximate merge must have run"
    assert not first["summary"]["exact"]
    worst = {"bins": 0.0, "scale": 0.0, "zero_point": 0}
    for rank in range(S.WORLD):
        result = main[rank]["histogram"]
        assert result["clip"].keys() == expected_clip.keys() and len(expected_clip) == 22
        for name, (lo, hi) in expected_clip.items():
            got_lo, got_hi = result["clip"][name]
            worst["bins"] = max(worst["bins"], abs(got_lo - lo), abs(got_hi - hi))
            scale, zero_point = result["qparams"][name]
            worst["scale"] = max(worst["scale"], abs(float(scale) / float(expected_qparams[name][0]) - 1))
            worst["zero_point"] = max(worst["zero_point"], abs(int(zero_point) - int(expected_qparams[name][1])))
            # every rank holds the same merged histogram
            assert torch.equal(scale, first["qparams"][name][0]) and torch.equal(zero_point, first["qparams"][name][1])
    assert worst["bins"] <= HISTOGRAM_BOUND_BINS, worst


# -- defined, not exact ------------------------------------------------------------------------------


@multi_process
def test_moving_averages_become_the_mean_of_the_ranks_states(main):
    before = [main[rank]["moving_average"]["before"] for rank in range(S.WORLD)]
    expected = {}
    for name in before[0]:
        expected[name] = dict(before[0][name])
        for key in ("min_val", "max_val"):
            stacked = torch.stack([b[name][key].double() for b in before])
            expected[name][key] = (stacked.sum(0) / S.WORLD).float()
    differing = [n for n in before[0] if any(not torch.equal(before[0][n][k], before[1][n][k]) for k in expected[n])]
    assert len(differing) == 4, "the activation observers (not the weights') differ between the ranks"
    for rank in range(S.WORLD):
        result = main[rank]["moving_average"]
        assert_same_states(result["states"], expected)
        assert sorted(result["summary"]["averaged"]) == sorted(expected) and not result["summary"]["exact"]
        assert result["summary"]["merged"] == {"moving_average_minmax": 4, "moving_average_per_channel_minmax": 2}


# -- observers without data -------------------------------------------------------------------------------


@multi_process
def test_a_rank_without_data_changes_nothing(main):
    for kind in ("minmax", "histogram"):
        reference = one_process(S.prepared_resnet(histogram=kind == "histogram"), S.shard(S.resnet_batches(), 0))
        for rank in range(S.WORLD):
            result = main[rank]["empty_rank"][kind]
            assert_same_states(result["states"], S.states(reference))
            assert result["summary"]["exact"] and result["summary"]["uncalibrated"] == ()


@multi_process
def test_observers_without_data_anywhere_stay_uncalibrated(main):
    for rank in range(S.WORLD):
        result = main[rank]["nowhere"]
        fed = result["fed"]
        assert set(result["summary"]["uncalibrated"]) == set(result["names"]) - {fed}
        assert result["summary"]["merged"] == {"minmax": 1}
        assert torch.equal(result["fed_state"]["min_val"], torch.tensor(-1.0))  # fed on rank 0 only
        assert torch.equal(result["fed_state"]["max_val"], torch.tensor(3.0))
        error_type, message = result["convert_error"]
        assert error_type == ObserverNotCalibratedError.__name__
        assert "activation_post_process_2" in message and fed not in message


# -- fake-quantizers --------------------------------------------------------------------------------


@multi_process
def test_fake_quantizers_sync_their_observer_and_refresh_scale_and_zero_point(main):
    reference = S.prepared_small(*S.QAT, qat=True)
    for batch in S.small_batches():
        reference(*batch)
    expected = S.states(reference)
    for rank in range(S.WORLD):
        result = main[rank]["qat"]
        assert_same_states(result["states"], expected)  # scale / zero_point buffers included
        assert result["summary"]["fake_quantizers"] == 6 and result["summary"]["exact"]


# -- failures: every rank raises, nothing changes --------------------------------------------------------


@multi_process
def test_ranks_with_different_observers_raise_on_every_rank_naming_them(main):
    for rank in range(S.WORLD):
        result = main[rank]["mismatch"]
        assert result["error"][0] == "DistributedSyncError" and result["unchanged"]
        message = result["error"][1]
        assert "activation_post_process_0 (observes 'x') differs between ranks" in message
        assert "observer.MinMaxObserver on rank 0" in message
        assert "observers.HistogramObserver (bins=2048) on rank 1" in message


@multi_process
def test_observer_types_that_cannot_be_merged_are_named(main):
    for rank in range(S.WORLD):
        plugin = main[rank]["unsupported"]["plugin_observer"]
        assert plugin["error"][0] == "DistributedSyncError" and plugin["unchanged"]
        assert "type tests.core._distributed.scenarios.CountingObserver" in plugin["error"][1]
        subclass = main[rank]["unsupported"]["overriding_subclass"]
        assert subclass["error"][0] == "DistributedSyncError" and subclass["unchanged"]
        assert "OverridingMinMax" in subclass["error"][1] and "overrides forward" in subclass["error"][1]


@multi_process
def test_a_rank_failing_inside_the_call_makes_every_rank_raise(main):
    for rank in range(S.WORLD):
        result = main[rank]["local_failure"]
        assert result["error"][0] == "DistributedSyncError" and result["unchanged"]
        assert "rank 1: ValueError: observer activation_post_process_0" in result["error"][1]


@multi_process
def test_a_rank_failing_between_the_collectives_makes_every_rank_raise_with_nothing_changed(main):
    for rank in range(S.WORLD):
        result = main[rank]["failure_while_merging"]
        assert result["error"][0] == "DistributedSyncError" and result["unchanged"]
        assert "rank 0 failed while preparing their histograms" in result["error"][1]
    assert "here: RuntimeError: rebin failed on purpose" in main[0]["failure_while_merging"]["error"][1]


@multi_process
def test_the_group_is_usable_after_those_errors(main):
    reference = one_process(S.prepared_small(S.MinMaxObserver, S.PerChannelMinMaxObserver), S.small_batches())
    for rank in range(S.WORLD):
        assert_same_states(main[rank]["usable_after_errors"]["states"], S.states(reference))


@multi_process
@pytest.mark.parametrize("mode", ["dead", "late"])
def test_a_rank_that_never_arrives_makes_the_others_raise_within_the_timeout(mode, tmp_path):
    """``dead``: rank 1 exits during calibration (gloo sees the connection close);
    ``late``: it stays alive but never calls (the timeout, naming it). Rank 0 raises in time
    -- not after the group's 60 s -- with its observers unchanged."""
    result = launch(mode, tmp_path)[0][mode]
    assert result["error"] is not None and result["error"][0] == "DistributedSyncError", result
    message = result["error"][1]
    assert "rank 0 of 2 failed at step 'join'" in message, message
    if mode == "late":
        assert "Ranks 1 failed to pass monitoredBarrier" in message, message  # gloo names it
    assert result["unchanged"]
    assert result["seconds"] < S.FAIL_TIMEOUT + 5, result


# -- in one process ------------------------------------------------------------------------------------


def test_without_a_process_group_it_is_a_one_process_merge():
    prepared = one_process(S.prepared_small(S.MinMaxObserver, S.PerChannelMinMaxObserver), S.small_batches())
    before = S.states(prepared)
    summary = sync_observers(prepared)
    assert isinstance(summary, SyncSummary) and summary.world_size == 1 and summary.exact
    assert summary.merged == {"minmax": 4, "per_channel_minmax": 2} and summary.uncalibrated == ()
    assert_same_states(S.states(prepared), before)


def test_bad_arguments():
    prepared = S.prepared_small(S.MinMaxObserver, S.PerChannelMinMaxObserver)
    with pytest.raises(TypeError, match="GraphModule"):
        sync_observers(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        sync_observers(prepared, timeout=-1)


def test_range_pass_restores_the_observers_when_its_block_raises():
    prepared = S.prepared_small(S.HistogramObserver, S.MovingAveragePerChannelMinMaxObserver)
    with pytest.raises(ZeroDivisionError), range_pass(prepared):
        prepared(*S.small_batches(1)[0])
        raise ZeroDivisionError  # a calibration failure: no collective, the exception propagates
    assert all("forward" not in vars(m) for m in S.observer_modules(prepared).values())
    assert not any(qw.observers.is_calibrated(m) for m in S.observer_modules(prepared).values())
    S.calibrate(prepared, S.small_batches(1))  # the real observers again
    assert all(qw.observers.is_calibrated(m) for m in S.observer_modules(prepared).values())


def test_range_pass_pauses_moving_averages_and_refuses_calibrated_histograms():
    prepared = S.prepared_small(S.HistogramObserver, S.MovingAveragePerChannelMinMaxObserver)
    with range_pass(prepared):
        S.calibrate(prepared, S.small_batches())
    observers = S.observer_modules(prepared)
    weights = [m for m in observers.values() if isinstance(m, S.MovingAveragePerChannelMinMaxObserver)]
    assert weights and not any(qw.observers.is_calibrated(m) for m in weights)  # paused
    histograms = [m for m in observers.values() if isinstance(m, S.HistogramObserver)]
    assert histograms and all(float(m.histogram.sum()) == 0 for m in histograms)  # started on the range
    with pytest.raises(ValueError) as info, range_pass(one_process(prepared, S.small_batches(1))):
        pass
    assert_names(info, "range_pass", "activation_post_process_0", "'x'", "already saw data", "before calibration")


def test_histogram_qparams_unchanged_by_a_one_process_sync():
    prepared = one_process(S.prepared_small(S.HistogramObserver, S.PerChannelMinMaxObserver), S.small_batches())
    expected = S.qparams(prepared)
    summary = sync_observers(prepared)
    assert summary.exact and summary.merged["histogram"] == 4
    assert all(torch.equal(S.qparams(prepared)[k][0], v[0]) for k, v in expected.items())


def test_quantweave_s_and_torch_s_histogram_observers_merge_alike_and_an_overriding_subclass_is_refused():
    from torch.ao.quantization.observer import HistogramObserver as TorchHistogramObserver

    from quantweave.observers import FastHistogramObserver

    batches = S.small_batches()
    merged = {}
    for label, ctr in (("quantweave", S.HistogramObserver), ("torch", TorchHistogramObserver)):
        prepared = one_process(S.prepared_small(ctr, S.PerChannelMinMaxObserver), batches)
        before = S.states(prepared)
        summary = sync_observers(prepared)
        assert summary.merged["histogram"] == 4 and summary.exact, label
        assert_same_states(S.states(prepared), before)
        merged[label] = S.states(prepared)
    assert_same_states(merged["quantweave"], merged["torch"])  # the same state, observer for observer
    assert FastHistogramObserver is S.HistogramObserver  # the former opt-in name: merged too

    class Clipping(S.HistogramObserver):
        def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
            return super().forward(x_orig.clamp(-1, 1))

    prepared = one_process(S.prepared_small(Clipping, S.PerChannelMinMaxObserver), batches)
    before = S.states(prepared)
    with pytest.raises(DistributedSyncError) as error:
        sync_observers(prepared)
    message = str(error.value)
    assert "subclasses quantweave.observers.HistogramObserver but overrides forward" in message, message
    assert "Clipping" in message
    assert_same_states(S.states(prepared), before)


def test_distributed_sync_error_is_a_runtime_error():
    assert issubclass(DistributedSyncError, RuntimeError)
    assert qw.errors.DistributedSyncError is DistributedSyncError


# -- the example ----------------------------------------------------------------------------------------


@multi_process
def test_the_example_calibrates_on_two_processes_under_torchrun_and_saves_on_rank_0(tmp_path):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "examples/distributed_calibration.py",
        "--out",
        str(tmp_path),
        "--batches",
        "4",
        "--batch-size",
        "2",
        "--image",
        "32",
        "--width",
        "8",
        "--quantizer",
        "reference",  # no plugin needed
        "--timeout",
        "60",
    ]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "ranks            2" in run.stdout and "reloads with identical outputs: True" in run.stdout
    record = json.loads((tmp_path / "summary.json").read_text())
    assert record["world_size"] == 2 and record["shard_batches"] == 2 and record["round_trip_identical"]
    assert record["merged"] == {"histogram": 38, "per_channel_minmax": 21} and record["uncalibrated"] == []
    program = torch.export.load(tmp_path / "model_int8.pt2").module()
    assert program(torch.randn(2, 3, 32, 32)).shape == (2, 10)

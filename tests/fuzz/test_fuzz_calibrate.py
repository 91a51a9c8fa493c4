"""Property (issue #20): a calibration batch the exported program rejects leaves every
observer unchanged.

Each example is a generated model (:mod:`tests.fuzz.programs`) prepared with one installed
quantizer configuration and calibrated on one good batch; then ``quantweave.calibrate``
gets a broken batch: another dtype, a wrong size in a static dimension, an extra or a
missing dimension, one input too many or too few, another batch size (rejected unless the
batch is dynamic), a NaN, or a good batch with one observer failing in the middle of the
forward. Whenever calibrate raises, the prepared model's state dict (observers and weights,
bit for bit) and the observers' Python attributes are what they were before; the mismatches
the program's inputs reveal raise :class:`~quantweave.errors.CalibrationInputError` naming
the batch.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

import quantweave as qw
from quantweave.errors import CalibrationInputError

from . import stats
from .conftest import budget
from .flow import configs, make_quantizer
from .programs import Program, build, dynamic_shapes, example_inputs, programs
from .properties import observer_state, observer_state_problems

pytestmark = pytest.mark.fuzz

#: mutation -> whether the exported program must reject it (None: depends on the program)
MUTATIONS: dict[str, bool | None] = {
    "other dtype": True,
    "static size": True,
    "extra dimension": True,
    "missing dimension": True,
    "extra input": True,
    "missing input": True,
    "other batch size": None,
    "NaN": None,
    "observer fails": None,
}


def _mutate(batch: tuple[torch.Tensor, ...], mutation: str) -> tuple[Any, ...]:
    first, *rest = batch
    if mutation == "other dtype":
        first = first.double() if first.is_floating_point() else first.float()
    elif mutation == "static size":
        first = torch.cat([first, first.narrow(-1, 0, 1)], dim=-1)
    elif mutation == "extra dimension":
        first = first.unsqueeze(0)
    elif mutation == "missing dimension":
        first = first[0]
    elif mutation == "extra input":
        rest = [*rest, torch.randn(2, 3)]
    elif mutation == "missing input":
        return tuple(rest)
    elif mutation == "other batch size":
        first, *rest = (torch.cat([t, t[:1]]) for t in batch)
    elif mutation == "NaN":  # into the first floating-point input
        inputs = [first, *rest]
        for i, t in enumerate(inputs):
            if t.is_floating_point():
                inputs[i] = t.clone()
                inputs[i].view(-1)[0] = float("nan")
                break
        return tuple(inputs)
    return (first, *rest)


@pytest.mark.parametrize("mutation", list(MUTATIONS))
@settings(max_examples=max(1, budget("rejected") // len(MUTATIONS)))
@given(program=programs(), config=st.sampled_from(configs()), data=st.data())
def test_a_rejected_batch_leaves_every_observer_unchanged(
    program: Program, config: Any, mutation: str, data: st.DataObject
) -> None:
    note(f"program:\n{program.describe()}\nquantizer: {config}\nmutation: {mutation}")
    model = build(program)
    exported = torch.export.export(model, example_inputs(program, 0), dynamic_shapes=dynamic_shapes(program)).module()
    stats.record_model("rejected", set(), exported)
    try:
        prepared = qw.prepare_pt2e(exported, make_quantizer(config))
        qw.calibrate(prepared, [example_inputs(program, 1)], progress=False)
    except Exception as exc:  # the flow tests judge prepare and good batches
        note(f"no good calibration to start from: {type(exc).__name__}: {exc}")
        assume(False)
        return
    before = observer_state(prepared)
    batch = _mutate(example_inputs(program, 2), mutation)
    broken = None
    if mutation == "observer fails":
        names = [str(n.target) for n in prepared.graph.nodes if n.op == "call_module" and n.target != "_guards_fn"]
        assume(names)
        broken = prepared.get_submodule(data.draw(st.sampled_from(names), label="failing observer"))
        saved = vars(broken).get("forward")

        def fail(*args: Any) -> Any:
            raise RuntimeError("observer failed on purpose")

        broken.forward = fail
    raised: BaseException | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            qw.calibrate(prepared, [batch], progress=False)
        except Exception as exc:
            raised = exc
    if broken is not None:
        if saved is None:
            del broken.forward
        else:
            broken.forward = saved
    must_reject = MUTATIONS[mutation]
    if mutation == "other batch size":
        must_reject = not program.dynamic_batch
    if mutation == "observer fails":
        must_reject = True
    stats.REJECTED[f"{mutation}: {'raised' if raised else 'accepted'}"] += 1
    if must_reject:
        assert raised is not None, f"{mutation}: calibrate accepted a batch the program cannot take"
        if mutation != "observer fails":
            assert isinstance(raised, CalibrationInputError), f"{type(raised).__name__}: {raised}"
        text = str(raised) + " ".join(getattr(raised, "__notes__", []))
        assert "batch 0" in text, text
    if raised is not None:
        problems = observer_state_problems(before, observer_state(prepared))
        assert not problems, f"{mutation}: {type(raised).__name__}: {raised}\n" + "\n".join(problems)

"""Bad input when combining or wrapping quantizers (issue #20): ``ComposableQuantizer`` given
one quantizer, a name, a class or a non-quantizer member, and ``fallback`` / ``LeaveFloat``
given a class or an ``evaluate`` that returns no number. Each raises a TypeError /
ValueError that says exactly that, and the caller's model is bit-identical afterwards."""

from __future__ import annotations

import pytest
import torch

import quantweave as qw
from quantweave_x86 import X86InductorQuantizer
from tests.helpers import assert_names, exported_once_fixtures


def _x86() -> X86InductorQuantizer:
    return X86InductorQuantizer()


#: (case, what is passed to ComposableQuantizer, what the TypeError names: the member at fault, what was expected,
#: what was given, the fix)
COMPOSE_ERRORS = [
    ("a single quantizer", _x86, ("list of quantizers", "single", "X86InductorQuantizer", "[quantizer]")),
    ("a quantizer name", lambda: "x86", ("list of quantizer instances", "str 'x86'")),
    ("a class", lambda: X86InductorQuantizer, ("class X86InductorQuantizer", "[X86InductorQuantizer()]")),
    ("a number", lambda: 3, ("list of quantizer instances", "int 3")),
    (
        "a class among the members",
        lambda: [_x86(), X86InductorQuantizer],
        ("member 1", "quantizer instance", "class X86InductorQuantizer", "X86InductorQuantizer()"),
    ),
    (
        "a name among the members",
        lambda: ["x86"],
        ("member 0", "quantweave.Quantizer", "got str", "quantweave.get_quantizer('x86')"),
    ),
    ("None among the members", lambda: [_x86(), None], ("member 1", "quantweave.Quantizer", "NoneType")),
    ("a module among the members", lambda: [torch.nn.Linear(2, 2)], ("member 0", "quantweave.Quantizer", "Linear")),
]


@pytest.mark.parametrize(("case", "given", "names"), COMPOSE_ERRORS, ids=[c[0] for c in COMPOSE_ERRORS])
def test_composable_quantizer_misuse_raises_type_error_saying_what_was_given(case, given, names):
    with pytest.raises(TypeError) as info:
        qw.ComposableQuantizer(given())
    assert_names(info, "ComposableQuantizer", *names)


def test_an_empty_composition_raises_value_error():
    with pytest.raises(ValueError) as info:
        qw.ComposableQuantizer([])
    assert_names(info, "needs at least one quantizer", "empty")


def test_a_tuple_or_generator_of_quantizers_composes():
    for members in ((_x86(),), (q for q in [_x86()])):
        assert qw.ComposableQuantizer(members).labels == ["x86"]


# -- fallback and LeaveFloat -----------------------------------------------------------------


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


X = torch.randn(8, 4)


# the caller's model, exported once for the module's tests, unchanged before and after each; seed 0:
# the weights each test's own export had (the autouse seed, then Net())
_caller_once, caller = exported_once_fixtures("caller", lambda: Net().eval(), lambda: (X,), seed=0)


#: (case, evaluate, exception, what the message names: evaluate, what it must return, the model it was called on
#: and what it returned)
EVALUATE_ERRORS = [
    ("returns None", lambda m: None, TypeError, ("number", "NoneType None")),
    ("returns a str", lambda m: "0.9", TypeError, ("number", "str '0.9'")),
    ("returns a list", lambda m: [0.9], TypeError, ("number", "list [0.9]")),
    ("returns a bool", lambda m: True, TypeError, ("number", "bool True")),
    ("returns a tensor of 2", lambda m: torch.ones(2), TypeError, ("number", "Tensor", "shape (2,)")),
    ("returns NaN", lambda m: float("nan"), ValueError, ("NaN",)),
]


@pytest.mark.parametrize(("case", "evaluate", "error", "names"), EVALUATE_ERRORS, ids=[c[0] for c in EVALUATE_ERRORS])
def test_fallback_evaluate_returning_no_number_raises_saying_so(caller, case, evaluate, error, names):
    with pytest.raises(error) as info:
        qw.fallback(caller, _x86(), [X], evaluate, max_drop=0.01)
    assert_names(info, "fallback", "evaluate (<lambda>)", *names, "float model")


def test_fallback_evaluate_failing_on_a_quantized_trial_names_the_trial(caller):
    calls = []

    def evaluate(model):
        calls.append(model)
        return 1.0 if len(calls) == 1 else None

    with pytest.raises(TypeError) as info:
        qw.fallback(caller, _x86(), [X], evaluate, max_drop=0.01)
    assert_names(info, "evaluate", "number", "all quantized")


def test_fallback_accepts_numbers_numpy_scalars_and_one_element_tensors(caller):
    import numpy as np

    for score in (1, 0.5, np.float32(0.5), torch.tensor(0.5), torch.tensor([0.5])):
        result = qw.fallback(caller, _x86(), [X], lambda m, s=score: s, max_drop=0.01)
        assert result.met and result.float_score == float(score)


@pytest.mark.parametrize(
    ("quantizer", "evaluate", "given"),
    [
        (X86InductorQuantizer, lambda m: 1.0, "class X86InductorQuantizer"),
        ("x86", lambda m: 1.0, "got str"),
        (None, 0.9, "NoneType"),
    ],
    ids=["class", "name", "None"],
)
def test_fallback_with_something_that_is_not_a_quantizer_raises_naming_it(caller, quantizer, evaluate, given):
    with pytest.raises(TypeError) as info:
        qw.fallback(caller, quantizer, [X], evaluate, max_drop=0.01)
    assert_names(info, "fallback", "quantizer", "quantweave.Quantizer instance", given)


def test_fallback_evaluate_that_is_not_callable_raises(caller):
    with pytest.raises(TypeError) as info:
        qw.fallback(caller, _x86(), [X], 0.9, max_drop=0.01)
    assert_names(info, "fallback", "evaluate", "callable", "float")


def test_leave_float_around_a_class_raises_saying_so():
    with pytest.raises(TypeError) as info:
        qw.LeaveFloat(X86InductorQuantizer, ["linear"])
    assert_names(info, "LeaveFloat", "quantweave.Quantizer", "X86InductorQuantizer")

"""The generator's own bookkeeping (tests/fuzz/programs.py): a step's State says what the
tensor it computes is, so the steps drawn after it are valid."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from .programs import State, _Drawer, _layer

pytestmark = pytest.mark.fuzz


def _non_contiguous(shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of ``shape`` laid out with its dims 1 and 2 swapped (as after a transpose)."""
    swapped = (shape[0], shape[2], shape[1], *shape[3:])
    return torch.randn(swapped).transpose(1, 2)


@settings(max_examples=60)
@given(data=st.data(), shape=st.sampled_from([(2, 3, 4), (2, 3, 4, 1), (2, 3, 4, 2)]))
def test_a_step_claims_contiguous_only_when_its_tensor_is(data: st.DataObject, shape: tuple[int, ...]) -> None:
    """``view`` is drawn only on a State marked contiguous. Found by a full-budget run: ``x + x``
    of a permuted tensor (which keeps its layout) and a ``reshape`` that returned a view of a
    transposed one were marked contiguous, and a ``view`` after them failed in export (dynamic
    batch: "Cannot view a tensor with shape [s21, 1, 2, 2] and strides (4, 2, 1, 2)")."""
    drawer = _Drawer(data.draw)
    x = _non_contiguous(shape)
    assert not x.is_contiguous()
    state = State(shape, owned=True, contiguous=False)
    method = data.draw(st.sampled_from(["self_binary", "reshape", "flatten", "unary", "const_binary", "unsqueeze"]))
    op, after = getattr(drawer, method)(state, None)
    with torch.no_grad():
        out = _layer(op).eval()(x.clone())
    assert tuple(out.shape) == after.shape == op.shape_out
    if after.contiguous:
        assert out.is_contiguous(), f"{op} marked contiguous, computes strides {out.stride()}"

"""Random exportable models: a small graph-program generator and its compiler.

A :class:`Program` is a list of steps drawn by hypothesis. A step is an :class:`Op` (one
layer applied to the current tensor) or a :class:`Branch` (two sub-programs from the
current tensor, or from the two halves of a split, merged by add / mul / sub / cat). Every
op knows the shape it receives and returns, so shapes are compatible by construction:
nothing is drawn that would fail to run or to export.

:class:`Net` compiles a program into an ``nn.Module``. Every op (merges and splits too) runs
inside its own submodule ``layers.<i>``, so each exported node can be traced back to the
op that made it (``nn_module_stack``) whatever the graph order is; ``Branch.swap`` runs the
right branch before the left one without changing what is computed (used to check that
quantization does not depend on the graph order of independent branches).

Ops, and the forms each is written in (module, functional, method, in-place):

* weighted: conv1d, conv2d (also ``padding="same"``, depthwise, strided, bias or not),
  conv_transpose2d, linear, embedding; a layer may be applied twice (shared weights);
* normalisation: batch_norm (1-d, 2-d, randomised running statistics), layer_norm;
* activations: relu, relu6, hardtanh, hardswish, silu, sigmoid, tanh, gelu, leaky_relu,
  softmax, clamp, abs, dropout;
* binary: add / mul / sub / div with a scalar, a parameter or a buffer, broadcasting, on
  either side; add / mul / cat of a tensor with itself; merges of two branches (residual
  add / mul / sub, cat along channels or features), split / chunk into two branches,
  squeeze-excite style broadcasting merges, a second model input merged in;
* matmul with a weight, activation x activation matmul, attention (matmul or bmm or
  ``scaled_dot_product_attention``);
* pooling and reductions: max_pool2d, avg_pool2d, adaptive_avg_pool2d, mean;
* shapes: flatten, reshape, view, permute, transpose, squeeze, unsqueeze, slice;
* dtype islands: elementwise ops run in float64 / float16 / bfloat16 between two casts;
* buffers written in forward (a call counter, a running mean);
* outputs: one tensor, or a tuple / list / dict with intermediate values; inputs: image,
  signal, sequence, features or token ids (int64 / int32); optionally a dynamic batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

__all__ = [
    "Branch",
    "Net",
    "Op",
    "Program",
    "build",
    "example_inputs",
    "programs",
    "swap_branches",
    "op_kinds",
]


# -- program representation ------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One layer: its kind, how it is written (``form``), its parameters, and the shapes."""

    kind: str
    form: str
    args: tuple[Any, ...]
    shape_in: tuple[int, ...]
    shape_out: tuple[int, ...]


@dataclass(frozen=True)
class Branch:
    """``merge(left(a), right(b))`` where ``a, b`` are the current tensor (or, with ``split``,
    its two halves). ``swap`` evaluates the right branch first (same result)."""

    left: tuple[Step, ...]
    right: tuple[Step, ...]
    merge: Op
    split: Op | None = None
    swap: bool = False


Step = Op | Branch


@dataclass(frozen=True)
class Program:
    input_kind: str  # image | signal | sequence | features | tokens
    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    steps: tuple[Step, ...]
    extra_inputs: tuple[tuple[int, ...], ...] = ()
    outputs: str = "single"  # single | tuple | list | dict
    dynamic_batch: bool = False
    seed: int = 0
    input_scale: float = 1.0
    vocab: int = 0

    def ops(self) -> list[Op]:
        return list(_walk(self.steps))

    def describe(self) -> str:
        return _describe(self.steps, 0)

    @property
    def divides_by_activation(self) -> bool:
        """``c / x``: a quantized divisor can round to 0 where the float one is tiny."""
        return any(op.kind == "const_binary" and op.args[0] == "div" and op.args[3] for op in self.ops())


def _walk(steps: tuple[Step, ...]) -> Any:
    for step in steps:
        if isinstance(step, Op):
            yield step
        else:
            if step.split is not None:
                yield step.split
            yield from _walk(step.left)
            yield from _walk(step.right)
            yield step.merge


def op_kinds(program: Program) -> set[str]:
    return {f"{op.kind}[{op.form}]" for op in program.ops()}


def _describe(steps: tuple[Step, ...], depth: int) -> str:
    pad = "  " * depth
    lines = []
    for step in steps:
        if isinstance(step, Op):
            lines.append(f"{pad}{step.kind}[{step.form}]{step.args} {step.shape_in}->{step.shape_out}")
        else:
            head = f"{pad}branch{' (swapped)' if step.swap else ''}"
            if step.split is not None:
                head += f" split {step.split.kind}[{step.split.form}]{step.split.args}"
            lines.append(head)
            lines.append(f"{pad} left:")
            lines.append(_describe(step.left, depth + 2))
            lines.append(f"{pad} right:")
            lines.append(_describe(step.right, depth + 2))
            lines.append(f"{pad} merge {step.merge.kind}[{step.merge.form}]{step.merge.args} -> {step.merge.shape_out}")
    return "\n".join(line for line in lines if line)


def swap_branches(program: Program) -> Program:
    """The same program with every branch evaluated in the other order."""

    def swap(steps: tuple[Step, ...]) -> tuple[Step, ...]:
        return tuple(
            s if isinstance(s, Op) else replace(s, left=swap(s.left), right=swap(s.right), swap=not s.swap)
            for s in steps
        )

    return replace(program, steps=swap(program.steps))


# -- drawing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """The current tensor: its shape, whether it may be modified in place (it is an
    intermediate value of this chain, not an input or another branch's value), and whether
    it is contiguous (``view`` needs that)."""

    shape: tuple[int, ...]
    owned: bool = False
    contiguous: bool = True


# preserve: None (anything), "all" (same shape out), or an int d (only dim d may change)
Preserve = Any

UNARY = (
    "relu",
    "relu6",
    "hardtanh",
    "hardswish",
    "silu",
    "sigmoid",
    "tanh",
    "gelu",
    "leaky_relu",
    "softmax",
    "clamp",
    "abs",
    "dropout",
)
INPLACE_UNARY = ("relu", "relu6", "hardtanh", "hardswish", "silu", "sigmoid", "tanh", "leaky_relu", "clamp")
METHOD_UNARY = ("relu", "sigmoid", "tanh", "softmax", "clamp", "abs")
MODULE_UNARY = tuple(op for op in UNARY if op not in ("clamp", "abs"))  # torch has no nn.Clamp / nn.Abs

SMALL = st.integers(1, 6)


def _keeps(shape: tuple[int, ...], out: tuple[int, ...], preserve: Preserve) -> bool:
    if preserve is None:
        return True
    if preserve == "all":
        return shape == out
    return len(shape) == len(out) and all(
        a == b for i, (a, b) in enumerate(zip(shape, out, strict=True)) if i != preserve
    )


class _Drawer:
    """Draws one op for a state; ``kinds(state, preserve)`` lists the applicable ones."""

    def __init__(self, draw: Callable[..., Any]) -> None:
        self.draw = draw

    def kinds(self, s: State, preserve: Preserve, top: bool) -> list[str]:
        shape = s.shape
        rank = len(shape)
        out = ["unary", "const_binary", "self_binary", "buffer_update"]
        if rank == 4:
            out += ["conv2d", "batch_norm"]
            if preserve in (None, 1):
                out += ["conv_transpose2d"]
            if (shape[2] >= 2 and shape[3] >= 2) or preserve in ("all", 1):
                out += ["max_pool2d", "avg_pool2d"]
            if preserve is None or (shape[2] == 1 and shape[3] == 1):
                out += ["adaptive_avg_pool2d"]
        if rank == 3:
            out += ["conv1d", "batch_norm"]
        if rank >= 2:
            out += ["linear", "layer_norm"]
            if preserve in (None, rank - 1):
                out += ["matmul_param"]
            if rank >= 3 and preserve in (None, rank - 1, "all"):
                out += ["attention"]
        if preserve is None:
            out += ["flatten", "reshape", "mean"]
            if rank >= 3:
                out += ["permute", "transpose", "self_matmul"]
            if any(d == 1 for d in shape[1:]):
                out += ["squeeze"]
            if rank <= 3:
                out += ["unsqueeze"]
            if any(d >= 2 for d in shape[1:]):
                out += ["slice"]
            out += ["island"]
        else:
            out += ["island"]
            if rank >= 3 and shape[1] == shape[-1] and preserve == "all":
                out += ["permute"]
        return sorted(set(out), key=_KIND_ORDER.index)

    # each returns (Op, State)

    def unary(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        d = self.draw
        kind = d(st.sampled_from(UNARY))
        forms = ["functional"]
        if kind in MODULE_UNARY:
            forms.append("module")
        if kind in METHOD_UNARY:
            forms.append("method")
        if kind in INPLACE_UNARY and s.owned:
            forms.append("inplace")
        form = d(st.sampled_from(forms))
        args: tuple[Any, ...] = ()
        if kind == "softmax":
            args = (d(st.sampled_from((-1, 1))),)
        elif kind == "gelu":
            args = (d(st.sampled_from(("none", "tanh"))),)
        # dropout in eval returns its input itself: an in-place op after it would write into
        # whatever the input is a view of (the caller's input), as the float model would
        owned = s.owned if kind == "dropout" else (form != "inplace" or s.owned)
        return Op(kind, form, args, s.shape, s.shape), replace(s, owned=owned)

    def const_binary(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        d = self.draw
        op = d(st.sampled_from(("add", "mul", "sub", "div")))
        operand = d(st.sampled_from(("scalar", "parameter", "buffer")))
        shape = s.shape
        if operand == "scalar":
            oshape: tuple[int, ...] = ()
        else:
            choices: list[tuple[int, ...]] = [(1,), (shape[-1],), shape[1:]]
            if len(shape) >= 3:
                choices.append((shape[1],) + (1,) * (len(shape) - 2))
            oshape = d(st.sampled_from(choices))
        forms = ["operator", "torch", "method"]
        if s.owned:
            forms.append("inplace")
        form = d(st.sampled_from(forms))
        left = form != "inplace" and d(st.booleans())  # operand on the left: c * x
        return Op("const_binary", form, (op, operand, oshape, left), shape, shape), replace(s, owned=True)

    def self_binary(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        options = ["add", "mul"]
        if preserve is None or preserve == 1:
            options.append("cat")
        op = self.draw(st.sampled_from(options))
        out = s.shape
        if op == "cat":
            out = (out[0], out[1] * 2, *out[2:])
        # x + x, x * x keep the layout of x (a permuted x stays non-contiguous); cat copies
        contiguous = op == "cat" or s.contiguous
        return Op("self_binary", "operator", (op,), s.shape, out), State(out, True, contiguous)

    def conv2d(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        d = self.draw
        n, c, h, w = s.shape
        keep_c = preserve not in (None, 1)
        depthwise = d(st.booleans()) and c > 1
        out_c = c if keep_c or depthwise else d(SMALL)
        k = d(st.sampled_from((1, 3)))
        stride = 1 if preserve is not None or min(h, w) < 2 else d(st.sampled_from((1, 2)))
        padding: Any = k // 2
        if stride == 1 and k == 3 and d(st.booleans()):
            padding = "same"
        groups = c if depthwise else 1
        bias = d(st.booleans())
        form = d(st.sampled_from(("module", "functional")))
        twice = c == out_c and stride == 1 and d(st.integers(0, 4)) == 0
        ho = (h + 2 * (k // 2) - k) // stride + 1
        wo = (w + 2 * (k // 2) - k) // stride + 1
        out = (n, out_c, ho, wo)
        return Op("conv2d", form, (c, out_c, k, stride, padding, groups, bias, twice), s.shape, out), State(out, True)

    def conv_transpose2d(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        d = self.draw
        n, c, h, w = s.shape
        depthwise = d(st.booleans()) and c > 1
        out_c = c if depthwise or preserve == "all" else d(SMALL)
        groups = c if depthwise else 1
        k, stride, padding = d(st.sampled_from(((3, 1, 1), (2, 2, 0), (1, 1, 0)) if preserve is None else ((3, 1, 1),)))
        bias = d(st.booleans())
        form = d(st.sampled_from(("module", "functional")))
        out = (n, out_c, (h - 1) * stride - 2 * padding + k, (w - 1) * stride - 2 * padding + k)
        return Op("conv_transpose2d", form, (c, out_c, k, stride, padding, groups, bias), s.shape, out), State(
            out, True
        )

    def conv1d(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        d = self.draw
        n, c, length = s.shape
        out_c = c if preserve not in (None, 1) else d(SMALL)
        k = d(st.sampled_from((1, 3)))
        bias = d(st.booleans())
        form = d(st.sampled_from(("module", "functional")))
        out = (n, out_c, length)
        return Op("conv1d", form, (c, out_c, k, k // 2, bias), s.shape, out), State(out, True)

    def batch_norm(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        form = self.draw(st.sampled_from(("module", "functional")))
        affine = self.draw(st.booleans())
        return Op("batch_norm", form, (s.shape[1], affine), s.shape, s.shape), State(s.shape, True)

    def _pool(self, kind: str, s: State, preserve: Preserve) -> tuple[Op, State]:
        n, c, h, w = s.shape
        if preserve is not None or min(h, w) < 2:
            k, stride, pad = 3, 1, 1
        else:
            k, stride, pad = self.draw(st.sampled_from(((2, 2, 0), (3, 1, 1))))
        form = self.draw(st.sampled_from(("module", "functional")))
        out = (n, c, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)
        return Op(kind, form, (k, stride, pad), s.shape, out), State(out, True)

    def max_pool2d(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        return self._pool("max_pool2d", s, preserve)

    def avg_pool2d(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        return self._pool("avg_pool2d", s, preserve)

    def adaptive_avg_pool2d(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        n, c = s.shape[:2]
        size = 1 if preserve is not None else self.draw(st.sampled_from((1, 2)))
        form = self.draw(st.sampled_from(("module", "functional")))
        out = (n, c, size, size)
        return Op("adaptive_avg_pool2d", form, (size,), s.shape, out), State(out, True)

    def linear(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        d = self.draw
        f = s.shape[-1]
        rank = len(s.shape)
        out_f = f if preserve not in (None, rank - 1) else d(st.integers(1, 8))
        bias = d(st.booleans())
        form = d(st.sampled_from(("module", "functional")))
        twice = out_f == f and d(st.integers(0, 4)) == 0
        out = (*s.shape[:-1], out_f)
        return Op("linear", form, (f, out_f, bias, twice), s.shape, out), State(out, True)

    def layer_norm(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        form = self.draw(st.sampled_from(("module", "functional")))
        affine = self.draw(st.booleans())
        return Op("layer_norm", form, (s.shape[-1], affine), s.shape, s.shape), State(s.shape, True)

    def matmul_param(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        d = self.draw
        f = s.shape[-1]
        out_f = d(st.integers(1, 8)) if preserve is None or preserve == len(s.shape) - 1 else f
        form = d(st.sampled_from(("operator", "torch", "method")))
        out = (*s.shape[:-1], out_f)
        return Op("matmul_param", form, (f, out_f), s.shape, out), State(out, True)

    def self_matmul(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        form = self.draw(st.sampled_from(("operator", "torch", "bmm") if len(s.shape) == 3 else ("operator", "torch")))
        out = (*s.shape[:-1], s.shape[-2])
        return Op("self_matmul", form, (), s.shape, out), State(out, True)

    def attention(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        d = self.draw
        f = s.shape[-1]
        dim = f if preserve == "all" else d(st.integers(1, 8))
        forms = ["operator", "sdpa"] + (["bmm"] if len(s.shape) == 3 else [])
        form = d(st.sampled_from(forms))
        out = (*s.shape[:-1], dim)
        return Op("attention", form, (f, dim), s.shape, out), State(out, True)

    def flatten(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        shape = s.shape
        start = self.draw(st.sampled_from((1, 2))) if len(shape) == 4 else 1
        if len(shape) == 2:
            return Op("flatten", "method", (1,), shape, shape), s
        out = (*shape[:start], math.prod(shape[start:]))
        form = self.draw(st.sampled_from(("module", "torch", "method")))
        # flatten / reshape of a non-contiguous tensor may return a view that is not contiguous
        return Op("flatten", form, (start,), shape, out), State(out, s.owned, s.contiguous)

    def reshape(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        shape = s.shape
        if len(shape) == 2:
            f = shape[1]
            out = (shape[0], 2, f // 2) if f % 2 == 0 else (shape[0], f, 1)
        elif len(shape) == 3:
            out = (shape[0], shape[1] * shape[2])
        else:
            out = (shape[0], shape[1], shape[2] * shape[3])
        forms = ["method", "torch"] + (["view"] if s.contiguous else [])
        form = self.draw(st.sampled_from(forms))
        return Op("reshape", form, (out[1:],), shape, out), State(out, s.owned, s.contiguous)

    def mean(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        shape = s.shape
        rank = len(shape)
        dims = self.draw(st.sampled_from(((-1,), (1,)) if rank < 4 else ((2, 3), (-1, -2), (-1,))))
        keepdim = self.draw(st.booleans())
        if not keepdim and rank - len(dims) < 2:
            keepdim = True
        norm = {d % rank for d in dims}
        out = tuple(1 if i in norm else x for i, x in enumerate(shape) if keepdim or i not in norm)
        form = self.draw(st.sampled_from(("method", "torch")))
        return Op("mean", form, (dims, keepdim), shape, out), State(out, True)

    def permute(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        shape = s.shape
        perm = (0, 2, 1) if len(shape) == 3 else self.draw(st.sampled_from(((0, 2, 3, 1), (0, 3, 1, 2), (0, 3, 2, 1))))
        if preserve == "all":
            perm = (0, *range(len(shape) - 1, 1, -1), 1) if len(shape) == 3 else (0, 3, 2, 1)
            perm = tuple(perm)
        out = tuple(shape[i] for i in perm)
        if preserve == "all" and out != shape:
            perm = tuple(range(len(shape)))
            out = shape
        form = self.draw(st.sampled_from(("method", "torch")))
        return Op("permute", form, (perm,), shape, out), State(out, s.owned, False)

    def transpose(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        shape = s.shape
        out = (shape[0], shape[-1], *shape[2:-1], shape[1])
        form = self.draw(st.sampled_from(("method", "torch")))
        return Op("transpose", form, (1, -1), shape, out), State(out, s.owned, False)

    def squeeze(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        shape = s.shape
        dims = [i for i in range(1, len(shape)) if shape[i] == 1]
        dim = self.draw(st.sampled_from(dims))
        if len(shape) == 2:  # keep rank >= 2: squeeze then unsqueeze back is pointless; use a no-op
            return Op("squeeze", "method", (dim, True), shape, shape), s
        out = tuple(x for i, x in enumerate(shape) if i != dim)
        form = self.draw(st.sampled_from(("method", "torch")))
        return Op("squeeze", form, (dim, False), shape, out), State(out, s.owned, s.contiguous)

    def unsqueeze(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        out = (*s.shape, 1)
        form = self.draw(st.sampled_from(("method", "torch")))
        return Op("unsqueeze", form, (-1,), s.shape, out), State(out, s.owned, s.contiguous)

    def slice(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        shape = s.shape
        dims = [i for i in range(1, len(shape)) if shape[i] >= 2]
        dim = self.draw(st.sampled_from(dims))
        stop = self.draw(st.integers(1, shape[dim] - 1))
        form = self.draw(st.sampled_from(("index", "narrow")))
        out = tuple(stop if i == dim else x for i, x in enumerate(shape))
        return Op("slice", form, (dim, stop), shape, out), State(out, s.owned, False)

    def buffer_update(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        """Buffers written in forward (a call counter, a running mean); the output is the input."""
        form = self.draw(st.sampled_from(("add_", "copy_")))
        return Op("buffer_update", form, (s.shape[-1],), s.shape, s.shape), s

    def island(self, s: State, preserve: Preserve) -> tuple[Op, State]:
        dtype = self.draw(st.sampled_from(("float64", "float16", "bfloat16")))
        op = self.draw(st.sampled_from(("mul", "add", "relu", "sigmoid")))
        return Op("island", "method", (dtype, op), s.shape, s.shape), State(s.shape, True)


_KIND_ORDER = [
    "unary",
    "const_binary",
    "self_binary",
    "linear",
    "conv2d",
    "conv1d",
    "batch_norm",
    "layer_norm",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "conv_transpose2d",
    "matmul_param",
    "attention",
    "self_matmul",
    "flatten",
    "reshape",
    "mean",
    "permute",
    "transpose",
    "squeeze",
    "unsqueeze",
    "slice",
    "island",
    "buffer_update",
]


def _draw_op(drawer: _Drawer, s: State, preserve: Preserve, top: bool) -> tuple[Op, State]:
    kind = drawer.draw(st.sampled_from(drawer.kinds(s, preserve, top)))
    op, new = getattr(drawer, kind)(s, preserve)
    assert _keeps(s.shape, op.shape_out, preserve), (op, preserve)
    return op, new


def _draw_steps(
    drawer: _Drawer, s: State, preserve: Preserve, max_steps: int, depth: int, ctx: _Context
) -> tuple[tuple[Step, ...], State]:
    steps: list[Step] = []
    n = drawer.draw(st.integers(0 if depth else 1, max_steps))
    for _ in range(n):
        if depth < 2 and drawer.draw(st.integers(0, 3)) == 0:
            step, s = _draw_branch(drawer, s, preserve, depth, ctx)
        elif depth == 0 and preserve is None and drawer.draw(st.integers(0, 9)) == 0:
            step, s = _draw_extra(drawer, s, ctx)
        else:
            step, s = _draw_op(drawer, s, preserve, depth == 0)
        steps.append(step)
    return tuple(steps), s


@dataclass
class _Context:
    extra_inputs: list[tuple[int, ...]] = field(default_factory=list)
    taps: int = 0


def _merge_forms(op: str, owned: bool) -> list[str]:
    forms = ["operator", "torch", "method"]
    if op in ("add", "mul", "sub") and owned:
        forms.append("inplace")
    return forms


def _draw_branch(drawer: _Drawer, s: State, preserve: Preserve, depth: int, ctx: _Context) -> tuple[Branch, State]:
    d = drawer.draw
    shape = s.shape
    rank = len(shape)
    kinds = ["residual", "se"]
    if preserve is None or preserve in (1, rank - 1):
        kinds.append("cat")
    if any(shape[i] >= 2 for i in (1, rank - 1)):
        kinds.append("split")
    kind = d(st.sampled_from(kinds))
    fresh = State(shape, owned=False, contiguous=s.contiguous)
    swap = d(st.booleans())
    if kind == "residual":
        left, ls = _draw_steps(drawer, fresh, "all", 3, depth + 1, ctx)
        right, rs = _draw_steps(drawer, fresh, "all", 3, depth + 1, ctx)
        op = d(st.sampled_from(("add", "mul", "sub")))
        form = d(st.sampled_from(_merge_forms(op, ls.owned and bool(left))))
        merge = Op("merge", form, (op,), shape, shape)
        # an elementwise merge takes its operands' layout: contiguous only if both are
        return Branch(left, right, merge, None, swap), State(shape, True, ls.contiguous and rs.contiguous)
    if kind == "se":
        # the right branch reduces to a broadcastable shape (squeeze-excite)
        if rank == 4:
            reduce_op = Op("mean", "method", ((2, 3), True), shape, (shape[0], shape[1], 1, 1))
        else:
            reduce_op = Op("mean", "method", ((-1,), True), shape, (*shape[:-1], 1))
        reduced = State(reduce_op.shape_out, owned=True)
        right, _ = _draw_steps(drawer, reduced, "all", 2, depth + 1, ctx)
        left, ls = _draw_steps(drawer, fresh, "all", 2, depth + 1, ctx)
        op = d(st.sampled_from(("mul", "add")))
        form = d(st.sampled_from(_merge_forms(op, ls.owned and bool(left))))
        merge = Op("merge", form, (op,), shape, shape)
        return Branch(left, (reduce_op, *right), merge, None, swap), State(shape, True, ls.contiguous)
    if kind == "cat":
        dims = [i for i in (1, rank - 1) if preserve is None or preserve == i]
        dim = d(st.sampled_from(dims))
        left, ls = _draw_steps(drawer, fresh, dim, 3, depth + 1, ctx)
        right, rs = _draw_steps(drawer, fresh, dim, 3, depth + 1, ctx)
        out = tuple(ls.shape[i] + rs.shape[i] if i == dim else x for i, x in enumerate(shape))
        if preserve == "all" or not _keeps(shape, out, preserve):
            raise AssertionError("cat branch drawn where the shape must be kept")
        form = d(st.sampled_from(("torch", "concat", "concatenate")))
        merge = Op("merge", form, ("cat", dim), shape, out)
        return Branch(left, right, merge, None, swap), State(out, True)
    # split into two halves along dim; merge by cat along dim (or add / mul if halves match)
    dims = [i for i in (1, rank - 1) if shape[i] >= 2]
    dim = d(st.sampled_from(dims))
    size = shape[dim]
    equal = size % 2 == 0
    first = size // 2 if equal else d(st.integers(1, size - 1))
    sform = d(st.sampled_from(("chunk", "split", "method_split") if equal else ("split", "method_split")))
    half_a = tuple(first if i == dim else x for i, x in enumerate(shape))
    half_b = tuple(size - first if i == dim else x for i, x in enumerate(shape))
    split = Op("split", sform, (dim, first), shape, half_a)
    ops = ["cat"]
    if equal and (preserve is None or preserve == dim):
        ops.append("add")  # the result is one half: the split dim changes
    op = d(st.sampled_from(ops))
    inner: Preserve = dim if op == "cat" and (preserve is None or preserve == dim) else "all"
    # the halves are views of the tensor, not contiguous (split along the last dim)
    left, ls = _draw_steps(drawer, State(half_a, contiguous=False), inner, 2, depth + 1, ctx)
    right, rs = _draw_steps(drawer, State(half_b, contiguous=False), inner, 2, depth + 1, ctx)
    if op == "cat":
        out = tuple(ls.shape[i] + rs.shape[i] if i == dim else x for i, x in enumerate(shape))
        merge = Op("merge", "torch", ("cat", dim), shape, out)
    else:
        out = ls.shape
        merge = Op("merge", d(st.sampled_from(_merge_forms(op, False))), (op,), shape, out)
    return Branch(left, right, merge, split, swap), State(out, True, op == "cat" or (ls.contiguous and rs.contiguous))


def _draw_extra(drawer: _Drawer, s: State, ctx: _Context) -> tuple[Op, State]:
    """A second model input merged into the current tensor (add / mul / cat), or a tap:
    the current tensor is also returned."""
    d = drawer.draw
    if d(st.booleans()):
        ctx.taps += 1
        return Op("tap", "-", (ctx.taps - 1,), s.shape, s.shape), replace(s, owned=False)
    op = d(st.sampled_from(("add", "mul", "cat")))
    shape = s.shape
    if op == "cat":
        extra = (shape[0], d(SMALL), *shape[2:])
        out = (shape[0], shape[1] + extra[1], *shape[2:])
    else:
        extra = shape if d(st.booleans()) else (shape[0], *([1] * (len(shape) - 2)), shape[-1])
        out = shape
    ctx.extra_inputs.append(extra)
    # add / mul keep the current tensor's layout (the extra input is contiguous); cat copies
    return Op("extra_input", "operator", (op, len(ctx.extra_inputs)), shape, out), State(
        out, True, op == "cat" or s.contiguous
    )


INPUT_KINDS = ("image", "sequence", "features", "signal", "tokens")


@st.composite
def programs(
    draw: Callable[..., Any],
    max_steps: int = 6,
    dynamic: bool = True,
    min_batch: int = 1,
    force_branch: bool = False,
    force_linear: bool = False,
) -> Program:
    """A random :class:`Program` (shrinks towards short chains of simple ops).

    ``dynamic``: may export with a dynamic batch; ``min_batch``: smallest batch size;
    ``force_branch``: at least one top-level branch (for the branch-order property);
    ``force_linear``: starts with a linear layer (something every backend quantizes)."""
    kind = draw(st.sampled_from(INPUT_KINDS))
    dynamic_batch = dynamic and draw(st.integers(0, 4)) == 0
    n = draw(st.integers(max(min_batch, 2 if dynamic_batch else 1), 3))
    vocab = 0
    dtype = torch.float32
    steps_prefix: list[Step] = []
    if kind == "image":
        shape: tuple[int, ...] = (n, draw(SMALL), draw(st.integers(1, 8)), draw(st.integers(1, 8)))
    elif kind in ("sequence", "signal"):  # (N, L, F) and (N, C, L): the ops drawn differ
        shape = (n, draw(SMALL), draw(st.integers(1, 8)))
    elif kind == "features":
        shape = (n, draw(st.integers(1, 8)))
    else:
        vocab = draw(st.integers(2, 10))
        shape = (n, draw(SMALL))
        dtype = draw(st.sampled_from((torch.int64, torch.int32)))
        dim = draw(st.integers(1, 8))
        form = draw(st.sampled_from(("module", "functional")))
        steps_prefix.append(Op("embedding", form, (vocab, dim), shape, (*shape, dim)))
    drawer = _Drawer(draw)
    ctx = _Context()
    start = State(steps_prefix[0].shape_out if steps_prefix else shape, owned=bool(steps_prefix))
    if force_linear:
        lead, start = drawer.linear(start, None)
        steps_prefix.append(lead)
    steps, end = _draw_steps(drawer, start, None, max_steps, 0, ctx)
    if force_branch and not any(isinstance(step, Branch) for step in steps):
        branch, _ = _draw_branch(drawer, end, None, 0, ctx)
        steps = (*steps, branch)
    outputs = "single" if not ctx.taps else draw(st.sampled_from(("tuple", "list", "dict")))
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from((1.0, 1.0, 1.0, 1e-3, 1e3)))
    return Program(
        kind,
        shape,
        dtype,
        (*steps_prefix, *steps),
        tuple(ctx.extra_inputs),
        outputs,
        dynamic_batch,
        seed,
        scale,
        vocab,
    )


# -- compiling -------------------------------------------------------------------------------


_MODULES: dict[str, Callable[[tuple[Any, ...]], nn.Module]] = {
    "relu": lambda a: nn.ReLU(),
    "relu6": lambda a: nn.ReLU6(),
    "hardtanh": lambda a: nn.Hardtanh(),
    "hardswish": lambda a: nn.Hardswish(),
    "silu": lambda a: nn.SiLU(),
    "sigmoid": lambda a: nn.Sigmoid(),
    "tanh": lambda a: nn.Tanh(),
    "gelu": lambda a: nn.GELU(approximate=a[0]),
    "leaky_relu": lambda a: nn.LeakyReLU(0.1),
    "softmax": lambda a: nn.Softmax(dim=a[0]),
    "dropout": lambda a: nn.Dropout(0.5),
}


def _functional(kind: str, x: torch.Tensor, args: tuple[Any, ...], inplace: bool = False) -> torch.Tensor:
    if kind == "relu":
        return F.relu(x, inplace=inplace)
    if kind == "relu6":
        return F.relu6(x, inplace=inplace)
    if kind == "hardtanh":
        return F.hardtanh(x, inplace=inplace)
    if kind == "hardswish":
        return F.hardswish(x, inplace=inplace)
    if kind == "silu":
        return F.silu(x, inplace=inplace)
    if kind == "sigmoid":
        return x.sigmoid_() if inplace else torch.sigmoid(x)
    if kind == "tanh":
        return x.tanh_() if inplace else torch.tanh(x)
    if kind == "gelu":
        return F.gelu(x, approximate=args[0])
    if kind == "leaky_relu":
        return F.leaky_relu(x, 0.1, inplace=inplace)
    if kind == "softmax":
        return F.softmax(x, dim=args[0])
    if kind == "clamp":
        return x.clamp_(-1.0, 1.0) if inplace else torch.clamp(x, -1.0, 1.0)
    if kind == "abs":
        return torch.abs(x)
    if kind == "dropout":
        return F.dropout(x, 0.5, training=False)
    raise AssertionError(kind)


def _method(kind: str, x: torch.Tensor, args: tuple[Any, ...]) -> torch.Tensor:
    if kind == "relu":
        return x.relu()
    if kind == "sigmoid":
        return x.sigmoid()
    if kind == "tanh":
        return x.tanh()
    if kind == "softmax":
        return x.softmax(args[0])
    if kind == "clamp":
        return x.clamp(-1.0, 1.0)
    if kind == "abs":
        return x.abs()
    raise AssertionError(kind)


class Unary(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        self.kind, self.form, self.args = op.kind, op.form, op.args
        if op.form == "module":
            self.inner = _MODULES[op.kind](op.args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "module":
            return self.inner(x)
        if self.form == "method":
            return _method(self.kind, x, self.args)
        return _functional(self.kind, x, self.args, inplace=self.form == "inplace")


def _binary(op: str, form: str, a: Any, b: Any) -> torch.Tensor:
    if form == "inplace":
        if op == "add":
            a += b
        elif op == "mul":
            a *= b
        elif op == "sub":
            a -= b
        else:
            a /= b
        return a
    if form == "operator":
        return _op(op, a, b)
    if form == "torch":
        return getattr(torch, op)(a, b)
    if isinstance(a, torch.Tensor):
        return getattr(a, op)(b)
    return _op(op, a, b)


def _op(op: str, a: Any, b: Any) -> torch.Tensor:
    if op == "add":
        return a + b
    if op == "mul":
        return a * b
    if op == "sub":
        return a - b
    return a / b


class ConstBinary(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        self.op, operand, oshape, self.left = op.args
        self.form = op.form
        self.operand = operand
        value = torch.rand(oshape) + 0.5 if oshape else None  # positive and away from zero (div)
        self.scalar = float(torch.rand(()) + 0.5)
        if operand == "parameter":
            self.c = nn.Parameter(value)
        elif operand == "buffer":
            self.register_buffer("c", value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c: Any = self.scalar if self.operand == "scalar" else self.c
        if self.left and self.form != "inplace":
            if self.form == "method" and isinstance(c, torch.Tensor):
                return getattr(c, self.op)(x)
            if self.form == "torch" and isinstance(c, torch.Tensor):
                return getattr(torch, self.op)(c, x)
            return _op(self.op, c, x)
        return _binary(self.op, self.form, x, c)


class SelfBinary(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        self.op = op.args[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.op == "cat":
            return torch.cat([x, x], 1)
        return _op(self.op, x, x)


class Weighted(nn.Module):
    """conv1d / conv2d / conv_transpose2d / linear, as a module or with F.* and its own parameters."""

    def __init__(self, op: Op) -> None:
        super().__init__()
        self.kind, self.form = op.kind, op.form
        a = op.args
        self.twice = False
        inner: nn.Module
        if op.kind == "conv2d":
            c, out_c, k, stride, padding, groups, bias, self.twice = a
            inner = nn.Conv2d(c, out_c, k, stride, padding, groups=groups, bias=bias)
            self.call = dict(stride=stride, padding=padding, groups=groups)
        elif op.kind == "conv1d":
            c, out_c, k, padding, bias = a
            inner = nn.Conv1d(c, out_c, k, padding=padding, bias=bias)
            self.call = dict(padding=padding)
        elif op.kind == "conv_transpose2d":
            c, out_c, k, stride, padding, groups, bias = a
            inner = nn.ConvTranspose2d(c, out_c, k, stride, padding, groups=groups, bias=bias)
            self.call = dict(stride=stride, padding=padding, groups=groups)
        else:
            f, out_f, bias, self.twice = a
            inner = nn.Linear(f, out_f, bias=bias)
            self.call = {}
        if op.form == "module":
            self.inner = inner
        else:
            self.weight = inner.weight
            self.bias = inner.bias

    def _apply_once(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "module":
            return self.inner(x)
        if self.kind == "conv2d":
            return F.conv2d(x, self.weight, self.bias, **self.call)
        if self.kind == "conv1d":
            return F.conv1d(x, self.weight, self.bias, **self.call)
        if self.kind == "conv_transpose2d":
            return F.conv_transpose2d(x, self.weight, self.bias, **self.call)
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._apply_once(x)
        return self._apply_once(y) if self.twice else y


def _randomize_running_stats(bn: nn.Module) -> None:
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        if getattr(bn, "weight", None) is not None:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)


class Norm(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        self.kind, self.form = op.kind, op.form
        size, affine = op.args
        inner: nn.Module
        if op.kind == "batch_norm":
            inner = (nn.BatchNorm2d if len(op.shape_in) == 4 else nn.BatchNorm1d)(size, affine=affine)
            _randomize_running_stats(inner)
        else:
            inner = nn.LayerNorm(size, elementwise_affine=affine)
        if op.form == "module":
            self.inner = inner
        else:
            self.weight = getattr(inner, "weight", None)
            self.bias = getattr(inner, "bias", None)
            self.size = size
            if op.kind == "batch_norm":
                self.register_buffer("running_mean", inner.running_mean)
                self.register_buffer("running_var", inner.running_var)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "module":
            return self.inner(x)
        if self.kind == "batch_norm":
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training)
        return F.layer_norm(x, (self.size,), self.weight, self.bias)


class Pool(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        self.kind, self.form, self.args = op.kind, op.form, op.args
        if op.form == "module":
            if op.kind == "max_pool2d":
                self.inner = nn.MaxPool2d(*op.args)
            elif op.kind == "avg_pool2d":
                self.inner = nn.AvgPool2d(*op.args)
            else:
                self.inner = nn.AdaptiveAvgPool2d(op.args[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "module":
            return self.inner(x)
        if self.kind == "max_pool2d":
            return F.max_pool2d(x, *self.args)
        if self.kind == "avg_pool2d":
            return F.avg_pool2d(x, *self.args)
        return F.adaptive_avg_pool2d(x, self.args[0])


class MatmulParam(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        f, out_f = op.args
        self.form = op.form
        self.weight = nn.Parameter(torch.randn(f, out_f) / math.sqrt(f))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "operator":
            return x @ self.weight
        if self.form == "torch":
            return torch.matmul(x, self.weight)
        return x.matmul(self.weight)


class SelfMatmul(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        self.form = op.form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "operator":
            return x @ x.transpose(-1, -2)
        if self.form == "torch":
            return torch.matmul(x, x.transpose(-1, -2))
        return torch.bmm(x, x.transpose(1, 2))


class Attention(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        f, dim = op.args
        self.form = op.form
        self.q, self.k, self.v = nn.Linear(f, dim), nn.Linear(f, dim), nn.Linear(f, dim)
        self.scale = dim**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.form == "sdpa":
            return F.scaled_dot_product_attention(q, k, v)
        if self.form == "bmm":
            return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * self.scale, -1), v)
        return torch.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1) @ v


class Shape(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        self.kind, self.form, self.args = op.kind, op.form, op.args
        if op.kind == "flatten" and op.form == "module":
            self.inner = nn.Flatten(op.args[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind, form, a = self.kind, self.form, self.args
        if kind == "flatten":
            if form == "module":
                return self.inner(x)
            return torch.flatten(x, a[0]) if form == "torch" else x.flatten(a[0])
        if kind == "reshape":
            shape = (x.shape[0], *a[0])
            if form == "view":
                return x.view(shape)
            return torch.reshape(x, shape) if form == "torch" else x.reshape(shape)
        if kind == "mean":
            return torch.mean(x, a[0], a[1]) if form == "torch" else x.mean(a[0], keepdim=a[1])
        if kind == "permute":
            return torch.permute(x, a[0]) if form == "torch" else x.permute(*a[0])
        if kind == "transpose":
            return torch.transpose(x, *a) if form == "torch" else x.transpose(*a)
        if kind == "squeeze":
            dim, noop = a
            if noop:
                return x.squeeze(dim).unsqueeze(dim)
            return torch.squeeze(x, dim) if form == "torch" else x.squeeze(dim)
        if kind == "unsqueeze":
            return torch.unsqueeze(x, a[0]) if form == "torch" else x.unsqueeze(a[0])
        if kind == "slice":
            dim, stop = a
            if form == "narrow":
                return torch.narrow(x, dim, 0, stop)
            index = (slice(None),) * dim + (slice(0, stop),)
            return x[index]
        raise AssertionError(kind)


class Island(nn.Module):
    """Elementwise work in another dtype between two casts."""

    def __init__(self, op: Op) -> None:
        super().__init__()
        self.dtype = getattr(torch, op.args[0])
        self.op = op.args[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.to(self.dtype)
        if self.op == "mul":
            y = y * y
        elif self.op == "add":
            y = y + y
        elif self.op == "relu":
            y = torch.relu(y)
        else:
            y = torch.sigmoid(y)
        return y.to(torch.float32)


class BufferUpdate(nn.Module):
    """Writes its buffers in forward and returns its input unchanged."""

    def __init__(self, op: Op) -> None:
        super().__init__()
        self.form = op.form
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("running", torch.zeros(op.args[0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        mean = x.detach().reshape(-1, x.shape[-1]).mean(0)
        if self.form == "copy_":
            self.running.copy_(mean)
        else:
            self.running.mul_(0.9).add_(0.1 * mean)
        return x


class Embedding(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        vocab, dim = op.args
        self.form = op.form
        self.inner = nn.Embedding(vocab, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "module":
            return self.inner(x)
        return F.embedding(x, self.inner.weight)


class Merge(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        self.form, self.args = op.form, op.args

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        op = self.args[0]
        if op == "cat":
            dim = self.args[1]
            if self.form == "concat":
                return torch.concat([a, b], dim)
            if self.form == "concatenate":
                return torch.concatenate([a, b], dim)
            return torch.cat([a, b], dim)
        return _binary(op, self.form, a, b)


class Split(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        self.form = op.form
        self.dim, self.first = op.args
        self.size = op.shape_in[self.dim]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = [self.first, self.size - self.first]
        if self.form == "chunk":
            a, b = torch.chunk(x, 2, self.dim)
        elif self.form == "split":
            a, b = torch.split(x, sizes, self.dim)
        else:
            a, b = x.split(sizes, dim=self.dim)
        return a, b


class ExtraInput(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()
        self.op, self.index = op.args

    def forward(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        if self.op == "cat":
            return torch.cat([x, other], 1)
        return _op(self.op, x, other)


class Tap(nn.Module):
    def __init__(self, op: Op) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


_LAYERS: dict[str, type[nn.Module]] = {
    "const_binary": ConstBinary,
    "self_binary": SelfBinary,
    "conv2d": Weighted,
    "conv1d": Weighted,
    "conv_transpose2d": Weighted,
    "linear": Weighted,
    "batch_norm": Norm,
    "layer_norm": Norm,
    "max_pool2d": Pool,
    "avg_pool2d": Pool,
    "adaptive_avg_pool2d": Pool,
    "matmul_param": MatmulParam,
    "self_matmul": SelfMatmul,
    "attention": Attention,
    "flatten": Shape,
    "reshape": Shape,
    "mean": Shape,
    "permute": Shape,
    "transpose": Shape,
    "squeeze": Shape,
    "unsqueeze": Shape,
    "slice": Shape,
    "island": Island,
    "buffer_update": BufferUpdate,
    "embedding": Embedding,
    "merge": Merge,
    "split": Split,
    "extra_input": ExtraInput,
    "tap": Tap,
}


def _layer(op: Op) -> nn.Module:
    if op.kind in UNARY:
        return Unary(op)
    return _LAYERS[op.kind](op)


class Net(nn.Module):
    """A compiled :class:`Program`. ``layers[i]`` is the i-th op in program order
    (pre-order: split, left branch, right branch, merge), whatever the evaluation order."""

    def __init__(self, program: Program) -> None:
        super().__init__()
        self.program = program
        layers: list[nn.Module] = []

        def compile_steps(steps: tuple[Step, ...]) -> tuple[Any, ...]:
            out: list[Any] = []
            for step in steps:
                if isinstance(step, Op):
                    layers.append(_layer(step))
                    out.append(("op", len(layers) - 1, step.kind))
                else:
                    split = None
                    if step.split is not None:
                        layers.append(_layer(step.split))
                        split = len(layers) - 1
                    left = compile_steps(step.left)
                    right = compile_steps(step.right)
                    layers.append(_layer(step.merge))
                    out.append(("branch", split, left, right, len(layers) - 1, step.swap))
            return tuple(out)

        with torch.random.fork_rng():
            torch.manual_seed(program.seed)
            self.plan = compile_steps(program.steps)
            self.layers = nn.ModuleList(layers)

    def _run(self, plan: tuple[Any, ...], x: torch.Tensor, inputs: tuple[torch.Tensor, ...], taps: list[Any]) -> Any:
        for item in plan:
            if item[0] == "op":
                _, index, kind = item
                layer = self.layers[index]
                if kind == "extra_input":
                    x = layer(x, inputs[layer.index])
                elif kind == "tap":
                    taps.append(x)
                else:
                    x = layer(x)
            else:
                _, split, left, right, merge, swap = item
                a, b = self.layers[split](x) if split is not None else (x, x)
                if swap:
                    rb = self._run(right, b, inputs, taps)
                    ra = self._run(left, a, inputs, taps)
                else:
                    ra = self._run(left, a, inputs, taps)
                    rb = self._run(right, b, inputs, taps)
                x = self.layers[merge](ra, rb)
        return x

    def forward(self, *inputs: torch.Tensor) -> Any:
        taps: list[Any] = []
        out = self._run(self.plan, inputs[0], inputs, taps)
        kind = self.program.outputs
        if kind == "single":
            return out
        if kind == "tuple":
            return (out, *taps)
        if kind == "list":
            return [out, *taps]
        return {"out": out, **{f"tap{i}": t for i, t in enumerate(taps)}}


def build(program: Program) -> Net:
    return Net(program).eval()


def example_inputs(program: Program, seed: int, batch: int | None = None) -> tuple[torch.Tensor, ...]:
    """Inputs for ``program`` (``batch`` overrides the batch size of a dynamic-batch program)."""
    gen = torch.Generator().manual_seed(seed)
    n = program.input_shape[0] if batch is None else batch
    first: torch.Tensor
    if program.input_kind == "tokens":
        first = torch.randint(0, program.vocab, (n, *program.input_shape[1:]), generator=gen, dtype=program.input_dtype)
    else:
        first = torch.randn((n, *program.input_shape[1:]), generator=gen) * program.input_scale
    extra = tuple(torch.randn((n, *s[1:]), generator=gen) * program.input_scale for s in program.extra_inputs)
    return (first, *extra)


def dynamic_shapes(program: Program) -> Any:
    if not program.dynamic_batch:
        return None
    batch = torch.export.Dim("batch", min=1, max=64)
    # forward(*inputs): one entry, for the tuple of inputs
    return (tuple({0: batch} for _ in range(1 + len(program.extra_inputs))),)

"""Per-op numeric debugger: which quantized op loses how much, worst first.

``compare(float_model, quantized_model, inputs)`` runs the exported float model and the
converted model on the same inputs and, for every op of the converted model that reads a
quantized tensor (an input through ``dequantize``: an activation or a weight), reports two
errors against the float op it stands for:

- **op** (``sqnr_db``, ``max_abs_error``): the op alone, reading its inputs quantized
  exactly as in the converted model (the same qparams, the same int8 weights) from the
  *float* model's values. Each quantize/dequantize of the model is counted once, by the op
  that reads it (a tensor the model returns quantized is counted by the op producing it),
  so this isolates what quantizing the tensors this op reads costs; it is what the ranking
  (worst first) and :func:`quantweave.fallback` use;
- **model** (``cumulative_sqnr_db``, ``cumulative_max_abs_error``): the converted model's
  own value at that op (every error before it included), as its consumers see it.

Matching uses the identity prepare and convert keep: both work on node-for-node copies of
the exported graph (``Graph.graph_copy``), which keep every node's name (and meta), and only
*add* observer / quantize / dequantize nodes. So the converted model's ``conv2d_1`` is the
float model's ``conv2d_1`` -- names are not guessed, and a name whose op differs is reported
unmatched, never compared. Pass the float model exactly as it was given to
``prepare_pt2e`` (the ``torch.export(...).module()`` GraphModule). One rewrite changes what
a node computes: eval-mode batch norm folded into the conv before it during prepare; the
folded conv is then compared with the float batch norm's output (the batch-norm node is
absent from the converted graph), and ``compared_with`` names it.

Works on models quantized by any quantizer or composition: only the converted graph's
quantize/dequantize ops are read. The report prints as an aligned table
(:meth:`NumericsReport.to_table`), as JSON (:meth:`NumericsReport.to_json`), and joined
with :func:`quantweave.annotation_report` rows (:func:`join_annotation_report`).
"""

from __future__ import annotations

import copy
import json
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from ._modules.batch_norm import batch_norm_call
from ._modules.patterns import node_op
from ._modules.prepare_rules import writes_first_input
from ._modules.text import format_db, json_number, render_table
from .convert import choose_qparams_ops, dequantize_ops, quantize_ops

__all__ = ["NumericsReport", "OpNumerics", "compare", "join_annotation_report"]


@dataclass(frozen=True)
class OpNumerics:
    """One quantized op of the converted model.

    ``node``: its name (the same in the float, prepared and converted graphs); ``op``: the
    aten op; ``module``: the ``nn.Module`` path it comes from (``nn_module_stack``);
    ``compared_with``: the float node whose output it is compared with (itself, or the
    batch norm folded into it); ``inputs_quantized`` / ``output_quantized``: what the
    converted model quantizes around it; ``sqnr_db`` / ``max_abs_error``: the op alone,
    reading its quantized inputs made from the float model's values; ``cumulative_*``: the
    converted model's value at this op, as its consumers read it. SQNR is ``inf`` for an
    exact match."""

    node: str
    op: str
    module: str
    compared_with: str
    inputs_quantized: int
    output_quantized: bool
    sqnr_db: float
    max_abs_error: float
    cumulative_sqnr_db: float
    cumulative_max_abs_error: float


@dataclass(frozen=True)
class NumericsReport:
    """Per-op numerics, worst (lowest op SQNR) first; ``unmatched`` lists quantized ops of
    the converted model with no float counterpart, with the reason."""

    ops: tuple[OpNumerics, ...]
    unmatched: tuple[tuple[str, str], ...] = ()
    batches: int = 0

    def worst(self, count: int = 5) -> tuple[OpNumerics, ...]:
        return self.ops[:count]

    def by_node(self) -> dict[str, OpNumerics]:
        return {op.node: op for op in self.ops}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ops": [{k: _json_number(v) for k, v in asdict(op).items()} for op in self.ops],
            "unmatched": [{"node": n, "reason": r} for n, r in self.unmatched],
            "batches": self.batches,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_table(self) -> str:
        header = ("node", "op", "module", "op SQNR dB", "op max err", "model SQNR dB", "model max err")
        rows = [
            (
                op.node if op.compared_with == op.node else f"{op.node} (= {op.compared_with})",
                _short_op(op.op),
                op.module or "-",
                _fmt_db(op.sqnr_db),
                f"{op.max_abs_error:.4g}",
                _fmt_db(op.cumulative_sqnr_db),
                f"{op.cumulative_max_abs_error:.4g}",
            )
            for op in self.ops
        ]
        lines = render_table(header, rows).splitlines()
        lines.append(
            f"{len(self.ops)} quantized ops compared on {self.batches} batch(es), worst first"
            + (
                f"; {len(self.unmatched)} unmatched: " + ", ".join(n for n, _ in self.unmatched)
                if self.unmatched
                else ""
            )
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_table()


_json_number = json_number  # old private names (their code moved to quantweave._modules.text)
_fmt_db = format_db


def _short_op(target: str) -> str:
    parts = target.split(".")
    return parts[-2] if len(parts) >= 3 else target


# -- running a graph and keeping every node's value ----------------------------------------------


class _Recorder(Interpreter):
    """Runs a GraphModule and keeps the value of every node (by node). A value an in-place op
    is about to write (``relu_`` of a conv's output) is kept as it was, in a copy."""

    def __init__(self, module: GraphModule) -> None:
        super().__init__(module, garbage_collect_values=False)
        self.values: dict[Node, Any] = {}

    def run_node(self, n: Node) -> Any:
        written = n.args[0] if writes_first_input(n) else None
        if isinstance(written, Node) and isinstance(self.values.get(written), torch.Tensor):
            self.values[written] = self.values[written].clone()
        value = super().run_node(n)
        self.values[n] = value
        return value


def _run(model: GraphModule, inputs: Sequence[Any]) -> dict[Node, Any]:
    recorder = _Recorder(model)
    with torch.no_grad():
        recorder.run(*inputs)
    return recorder.values


def _passthrough(x: Any) -> Any:
    return x


def _as_float(model: GraphModule) -> GraphModule:
    """``model`` itself when it holds no observer or fake-quantizer; otherwise (a prepared
    model, e.g. after QAT) a copy in which each of them passes its input through, so the
    copy computes in float with the model's (trained) weights and the caller's observers
    keep their state."""
    from .observers import is_observer_module

    names = [n.target for n in model.graph.nodes if n.op == "call_module"]
    if not any(is_observer_module(model.get_submodule(str(t))) for t in names):
        return model
    copied = copy.deepcopy(model)
    for target in names:
        module = copied.get_submodule(str(target))
        if is_observer_module(module):
            # an instance attribute shadows the class's forward (nn.Module.__call__ looks it up)
            setattr(module, "forward", _passthrough)  # noqa: B010
    return copied


@dataclass
class _Stats:
    signal: float = 0.0
    noise: float = 0.0
    max_abs: float = 0.0

    def add(self, reference: torch.Tensor, approximation: torch.Tensor) -> None:
        reference, approximation = reference.detach().double(), approximation.detach().double()
        diff = reference - approximation
        self.signal += float(reference.pow(2).sum())
        self.noise += float(diff.pow(2).sum())
        if diff.numel():
            self.max_abs = max(self.max_abs, float(diff.abs().max()))

    @property
    def sqnr_db(self) -> float:
        if self.noise == 0:
            return math.inf
        if self.signal == 0:
            return -math.inf
        return 10 * math.log10(self.signal / self.noise)


# -- the converted graph: quantize / dequantize machinery and the ops around it -----------------


@dataclass
class _Machinery:
    quantize: frozenset[Any] = field(default_factory=lambda: frozenset(quantize_ops()))
    dequantize: frozenset[Any] = field(default_factory=lambda: frozenset(dequantize_ops()))

    choose: frozenset[Any] = field(default_factory=lambda: frozenset(choose_qparams_ops()))

    def is_machinery(self, node: Node) -> bool:
        """quantize / dequantize / choose_qparams nodes and the getitems of choose_qparams."""
        if node.op != "call_function":
            return False
        if node.target in self.quantize or node.target in self.dequantize or node.target in self.choose:
            return True
        if node.target is operator.getitem:
            source = node.args[0]
            return isinstance(source, Node) and source.target in self.choose
        return False

    def returned_dq(self, node: Node) -> Node | None:
        """The dequantize of ``node``'s quantized output that the model returns, if any."""
        for user in node.users:
            if user.op != "call_function" or user.target not in self.quantize:
                continue
            for dq in user.users:
                if (
                    dq.op == "call_function"
                    and dq.target in self.dequantize
                    and any(u.op == "output" for u in dq.users)
                ):
                    return dq
        return None

    def quantized_output_dq(self, node: Node) -> Node | None:
        """The dequantize a quantized output is read through: ``node``'s users are all
        quantize ops; the first dequantize of the first of them."""
        users = list(node.users)
        if not users or not all(u.op == "call_function" and u.target in self.quantize for u in users):
            return None
        for user in users:
            for dq in user.users:
                if dq.op == "call_function" and dq.target in self.dequantize:
                    return dq
        return None


#: the arithmetic prepare_qat_pt2e puts between a conv and its batch norm (the conv's output
#: divided by the weight's scale factor, plus its bias), which convert folds away
_QAT_RESCALE = frozenset(
    (torch.ops.aten.div.Tensor, torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor, torch.ops.aten.sub.Tensor)
)


def _float_counterpart(name: str, float_nodes: Mapping[str, Node], quantized_names: set[str]) -> Node:
    """The float node whose output the converted node ``name`` computes: the node of the
    same name, or, when batch norm was folded into it (prepare folds eval-mode batch norm
    into the conv before it, and the batch-norm node is gone from the converted graph),
    the batch norm's normalised output. After QAT the float model is the prepared one,
    where the conv reaches its batch norm through the re-scaling arithmetic of the QAT
    conv + batch norm pattern (gone from the converted graph too)."""
    node = float_nodes[name]
    while len(node.users) == 1:
        (user,) = node.users
        if user.name in quantized_names:
            break
        bn = batch_norm_call(user)
        if bn is not None and bn.input is node and not bn.training:
            node = user
            continue
        if user.target is operator.getitem and user.args[1] == 0 and batch_norm_call(node) is not None:
            node = user
            continue
        folded = _through_qat_rescale(user, quantized_names)
        if folded is not None:
            node = folded
            continue
        break
    return node


def _through_qat_rescale(user: Node, quantized_names: set[str]) -> Node | None:
    """The eval-mode batch norm that ``user`` leads to through a chain of single-user
    arithmetic nodes absent from the converted graph, or None."""
    chain = user
    while chain.op == "call_function" and chain.target in _QAT_RESCALE and chain.name not in quantized_names:
        if len(chain.users) != 1:
            return None
        (following,) = chain.users
        bn = batch_norm_call(following)
        if bn is not None and bn.input is chain and not bn.training:
            return following
        chain = following
    return None


def _shape(node: Node) -> tuple[str, ...] | None:
    val = node.meta.get("val")
    return tuple(str(d) for d in val.shape) if isinstance(val, torch.Tensor) else None


def _mismatch(float_node: Node, node: Node) -> str | None:
    """Why two nodes of the same name are not the same node (another model, another
    export), or None: they must call the same op (an in-place op, which prepare annotates as
    its functional op, counts as it), from the same module, with the same output shape."""
    if node_op(float_node) != node_op(node):
        return f"the float model's {node.name!r} calls {float_node.target}, this node {node.target}"
    if _module_path(float_node) != _module_path(node):
        return (
            f"the float model's {node.name!r} comes from module {_module_path(float_node)!r}, "
            f"this node from {_module_path(node)!r}"
        )
    if _shape(float_node) != _shape(node):
        return f"the float model's {node.name!r} has output shape {_shape(float_node)}, this node {_shape(node)}"
    return None


def _module_path(node: Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not isinstance(stack, dict) or not stack:
        return ""
    path = list(stack.values())[-1]
    return str(path[0]) if isinstance(path, tuple) else str(path)


def _as_batches(inputs: Any) -> list[tuple[Any, ...]]:
    """One batch (a tuple of model arguments, or a single tensor) or a list of batches."""
    if isinstance(inputs, torch.Tensor):
        return [(inputs,)]
    if isinstance(inputs, tuple):
        return [inputs]
    if isinstance(inputs, Iterable):
        out = []
        for batch in inputs:
            out.append(batch if isinstance(batch, tuple) else (batch,))
        if not out:
            raise ValueError("compare: inputs is an empty iterable; give at least one batch")
        return out
    raise TypeError(f"compare: inputs must be a tensor, a tuple of model arguments or a list of them; got {inputs!r}")


def compare(
    float_model: GraphModule,
    quantized_model: GraphModule,
    inputs: Any,
) -> NumericsReport:
    """Per-op SQNR and max abs error of ``quantized_model`` against ``float_model``.

    ``float_model``: the exported float GraphModule given to ``prepare_pt2e`` -- or, after
    QAT, the trained prepared model (``prepare_qat_pt2e``'s result, moved to eval), run in
    float on a copy whose fake-quantizers pass their input through, so the reference has
    the trained weights; ``quantized_model``: what ``convert_pt2e`` returned for it (any
    quantizer or composition); ``inputs``: one batch (a tuple of model arguments, or a
    tensor) or a list of batches (errors are summed over all of them). Returns the ops
    worst first.
    """
    for label, model in (("float_model", float_model), ("quantized_model", quantized_model)):
        if not isinstance(model, GraphModule):
            raise TypeError(
                f"compare: {label} must be a torch.fx.GraphModule (float: the torch.export(...).module() given to "
                f"prepare_pt2e; quantized: what convert_pt2e returned); got {type(model).__name__}"
            )
    machinery = _Machinery()
    float_nodes = {n.name: n for n in float_model.graph.nodes}
    quantized_names = {n.name for n in quantized_model.graph.nodes}

    # the converted model's ops that quantization touches, and what each is compared with
    # (node, float counterpart, #dq inputs, the dq its consumers read, the dq the op's own error includes)
    plan: list[tuple[Node, Node, int, Node | None, Node | None]] = []
    unmatched: list[tuple[str, str]] = []
    for node in quantized_model.graph.nodes:
        if node.op != "call_function" or machinery.is_machinery(node):
            continue
        dq_inputs = sum(1 for a in node.all_input_nodes if a.op == "call_function" and a.target in machinery.dequantize)
        output_dq = machinery.quantized_output_dq(node)
        # an output quantization is counted where it is read: in the consuming op's own error
        # (its dequantized input), or here when the model returns it
        own_output_dq = machinery.returned_dq(node)
        if not dq_inputs and own_output_dq is None:
            continue
        float_node = float_nodes.get(node.name)
        if float_node is None:
            unmatched.append((node.name, "no node of this name in the float model (not derived from it?)"))
            continue
        mismatch = _mismatch(float_node, node)
        if mismatch is not None:
            unmatched.append((node.name, mismatch))
            continue
        counterpart = _float_counterpart(node.name, float_nodes, quantized_names)
        plan.append((node, counterpart, dq_inputs, output_dq, own_output_dq))

    local = {node: _Stats() for node, *_ in plan}
    cumulative = {node: _Stats() for node, *_ in plan}
    batches = _as_batches(inputs)
    float_runner = _as_float(float_model)  # node names are the same in a copy
    for batch in batches:
        float_values = _run(float_runner, batch)
        quant_values = _run(quantized_model, batch)
        float_by_name = {n.name: v for n, v in float_values.items()}
        with torch.no_grad():
            for node, counterpart, _, output_dq, own_output_dq in plan:
                reference = float_by_name[counterpart.name]
                if not isinstance(reference, torch.Tensor):
                    continue
                seen = quant_values[output_dq] if output_dq is not None else quant_values[node]
                cumulative[node].add(reference, seen)
                local[node].add(
                    reference,
                    _local_value(
                        node, own_output_dq, quant_values, float_by_name, float_nodes, quantized_names, machinery
                    ),
                )

    ops = [
        OpNumerics(
            node=node.name,
            op=str(node.target),
            module=_module_path(node),
            compared_with=counterpart.name,
            inputs_quantized=dq_inputs,
            output_quantized=output_dq is not None,
            sqnr_db=local[node].sqnr_db,
            max_abs_error=local[node].max_abs,
            cumulative_sqnr_db=cumulative[node].sqnr_db,
            cumulative_max_abs_error=cumulative[node].max_abs,
        )
        for node, counterpart, dq_inputs, output_dq, _ in plan
    ]
    ops.sort(key=lambda o: (o.sqnr_db, o.cumulative_sqnr_db))
    return NumericsReport(tuple(ops), tuple(unmatched), len(batches))


def _local_value(
    node: Node,
    output_dq: Node | None,
    quant_values: Mapping[Node, Any],
    float_by_name: Mapping[str, Any],
    float_nodes: Mapping[str, Node],
    quantized_names: set[str],
    machinery: _Machinery,
) -> torch.Tensor:
    """``node`` run alone: its quantize/dequantize inputs recomputed on the float model's
    values of their sources, constants (int8 weights, qparams) from the converted model,
    and, when ``output_dq`` is given (the model returns the quantized output), its output
    quantized then dequantized as in the converted model."""
    memo: dict[Node, Any] = {}

    def value(arg: Node) -> Any:
        if arg in memo:
            return memo[arg]
        if machinery.is_machinery(arg):
            args, kwargs = torch.fx.node.map_arg((arg.args, arg.kwargs), value)
            assert callable(arg.target)
            result = arg.target(*args, **kwargs)
        elif arg.op in ("call_function", "placeholder") and arg.name in float_nodes:
            result = float_by_name[_float_counterpart(arg.name, float_nodes, quantized_names).name]
        else:  # get_attr (int8 weights, qparams, folded biases) and what the float model lacks
            result = quant_values[arg]
        memo[arg] = result
        return result

    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), value)
    assert callable(node.target)
    out = node.target(*args, **kwargs)
    if output_dq is not None:  # dequantize(quantize(out)) with the converted model's qparams
        memo[node] = out
        out = value(output_dq)
    assert isinstance(out, torch.Tensor)
    return out


def join_annotation_report(numerics: NumericsReport, report: Any) -> list[dict[str, Any]]:
    """The rows of an :class:`~quantweave.report.AnnotationReport` (from the prepared model)
    with each quantized node's numerics (``None`` for float nodes and nodes the converted
    model does not quantize), ordered like ``numerics`` (worst first), then the rest in
    graph order. Node names are the same in the prepared and the converted model."""
    by_node = numerics.by_node()
    order = {op.node: i for i, op in enumerate(numerics.ops)}
    rows = []
    for entry in report.nodes:
        op = by_node.get(entry.node)
        row: dict[str, Any] = {
            "node": entry.node,
            "op": entry.op,
            "status": entry.status,
            "quantizer": entry.quantizer,
            "reason": entry.reason,
            "sqnr_db": None if op is None else op.sqnr_db,
            "max_abs_error": None if op is None else op.max_abs_error,
            "cumulative_sqnr_db": None if op is None else op.cumulative_sqnr_db,
        }
        rows.append(row)
    rows.sort(key=lambda r: order.get(r["node"], len(order)))
    return rows

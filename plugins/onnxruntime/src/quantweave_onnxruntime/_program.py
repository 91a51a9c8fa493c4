"""A converted GraphModule as a ``torch.export.ExportedProgram``, without tracing it again.

``torch.onnx.export(converted, args, dynamo=True)`` first runs ``torch.export.export`` on the
converted module: a second trace of a graph that ``torch.export`` already produced (the float
model's) and that ``prepare_pt2e`` / ``convert_pt2e`` only rewrote. On a Q/DQ graph that trace
is a third of the exporter's time (4-layer BERT, 531 FX nodes: about 2.2 CPU s, one thread),
because every quantize / dequantize pair is traced through fake tensors, functionalization and
the export machinery. :func:`exported_program` builds the program the exporter would have
captured directly from the graph: the ``get_attr`` nodes (parameters, the int8 weights and
qparams ``convert_pt2e`` stored as attributes) lifted to placeholders with an
``ExportGraphSignature`` (parameters, buffers and constants as ``torch.export`` lifts them, under
the same targets, which become the ONNX initializers' names), every node copied with its
metadata, and the output values recomputed by one fake-tensor propagation (``FakeTensorProp``,
about a fifth of the trace's cost). Only public ``torch.export`` / ``torch.fx`` classes are
used; the graph is what ``torch.export`` makes (placeholders, ``get_attr``, ``call_function``
on ``OpOverload`` s and ``operator.getitem``, the unlifted module's ``_guards_fn`` call, the
output); anything else returns None and the exporter captures the module itself, as before.

``converted`` is not modified: the program has its own graph and nodes (their metadata dicts
copied), and shares the module's tensors, which nothing writes.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["decompose_nodes", "exported_program", "unsupported"]

#: ``torch.export(...).module()`` calls this submodule first to check its inputs (no output used)
_GUARDS = "_guards_fn"


def _attribute(module: torch.nn.Module, target: str) -> tuple[torch.nn.Module, str, Any]:
    """(owner module, attribute name, value) of a dotted ``get_attr`` target."""
    owner_path, _, name = target.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    return owner, name, getattr(owner, name)


def unsupported(model: torch.nn.Module, args: Sequence[Any]) -> str | None:
    """Why :func:`exported_program` cannot build a program of ``model`` (None: it can)."""
    if not isinstance(model, torch.fx.GraphModule):
        return f"not a GraphModule ({type(model).__name__})"
    placeholders = [n for n in model.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args) or not all(isinstance(a, torch.Tensor) for a in args):
        return f"inputs are not {len(placeholders)} tensors"
    for node in model.graph.nodes:
        if node.op == "call_function":
            if not isinstance(node.target, torch._ops.OpOverload) and node.target is not operator.getitem:
                return f"node {node.name!r} calls {node.target!r}, not an ATen / custom op overload"
        elif node.op == "call_module":
            if node.target != _GUARDS or node.users:
                return f"node {node.name!r} calls submodule {node.target!r}"
        elif node.op == "get_attr":
            if not isinstance(_attribute(model, node.target)[2], torch.Tensor):
                return f"node {node.name!r} reads {node.target!r}, not a tensor"
        elif node.op == "output":
            if not all(isinstance(leaf, torch.fx.Node) for leaf in _outputs(model, node)):
                return "an output is not a tensor computed by the graph"
        elif node.op != "placeholder":  # pragma: no cover - fx has no other kinds
            return f"node {node.name!r} is a {node.op!r} node"
    return None


def _outputs(model: torch.fx.GraphModule, output: torch.fx.Node) -> list[Any]:
    """The flat outputs: the unlifted module's output node holds the flat leaves already (its
    pytree codegen rebuilds the structure); a plain graph's output is flattened here."""
    info = getattr(model.graph._codegen, "pytree_info", None)
    if info is not None:
        return list(output.args[0])  # type: ignore[arg-type]
    return list(torch.utils._pytree.tree_leaves(output.args[0]))


def _traced_name(node: torch.fx.Node) -> str | None:
    target = node.target
    return target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else None


def _copy_call(graph: torch.fx.Graph, node: torch.fx.Node, env: Mapping[torch.fx.Node, torch.fx.Node]) -> torch.fx.Node:
    """A copy of the call ``node`` in ``graph``, its inputs mapped through ``env``, named as
    ``torch.export`` names the nodes it traces (:func:`_traced_name`)."""
    return graph.create_node(
        "call_function",
        node.target,
        torch.fx.map_arg(node.args, env.__getitem__),
        torch.fx.map_arg(node.kwargs, env.__getitem__),
        name=_traced_name(node),
    )


def _module_stack(node: torch.fx.Node) -> dict[str, Any]:
    """The ``nn_module_stack`` of the first computed input of ``node`` (copied in graph order, so
    it has one, its own or its input's); {} when every input is a placeholder (a weight)."""
    for source in node.all_input_nodes:
        if source.op == "call_function" and "nn_module_stack" in source.meta:
            return dict(source.meta["nn_module_stack"])
    return {}


def _lifted_name(prefix: str, target: str, taken: set[str]) -> str:
    stem = prefix + re.sub(r"[^0-9a-zA-Z_]", "_", target).lower()
    name, i = stem, 0
    while name in taken:
        i += 1
        name = f"{stem}_{i}"
    taken.add(name)
    return name


def exported_program(model: torch.nn.Module, args: tuple[Any, ...]) -> torch.export.ExportedProgram | None:
    """The ExportedProgram ``torch.export.export(model, args)`` captures for a converted
    GraphModule ``model``, built from its graph without tracing; None when the graph is not one
    :func:`unsupported` accepts (the caller then exports the module itself)."""
    if unsupported(model, args) is not None:
        return None
    assert isinstance(model, torch.fx.GraphModule)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.export import ExportedProgram
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
    from torch.export.graph_signature import (
        ExportGraphSignature,
        InputKind,
        InputSpec,
        OutputKind,
        OutputSpec,
        TensorArgument,
    )
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    nodes = list(model.graph.nodes)
    user_inputs = [n for n in nodes if n.op == "placeholder"]
    taken = {n.name for n in nodes}
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    lifted: dict[str, torch.fx.Node] = {}
    input_specs: list[Any] = []
    state_dict: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    parameters = {id(p) for p in model.parameters()}
    # the lifted weights first, then the user inputs (torch.export's order)
    for node in nodes:
        if node.op != "get_attr":
            continue
        if node.target in lifted:
            env[node] = lifted[node.target]
            continue
        owner, attribute, value = _attribute(model, node.target)
        if isinstance(value, torch.nn.Parameter) and id(value) in parameters:
            kind, prefix, persistent = InputKind.PARAMETER, "p_", None
            state_dict[node.target] = value
        elif attribute in owner._buffers:
            persistent = attribute not in owner._non_persistent_buffers_set
            kind, prefix = InputKind.BUFFER, "b_"
            (state_dict if persistent else constants)[node.target] = value
        else:
            kind, prefix, persistent = InputKind.CONSTANT_TENSOR, "c_", None
            constants[node.target] = value
        placeholder = graph.placeholder(_lifted_name(prefix, node.target, taken))
        placeholder.meta = dict(node.meta)
        env[node] = lifted[node.target] = placeholder
        input_specs.append(InputSpec(kind, TensorArgument(placeholder.name), node.target, persistent))
    for node in user_inputs:
        placeholder = graph.placeholder(node.name)
        if placeholder.name != node.name:  # pragma: no cover - the names were fx's own
            return None
        placeholder.meta = dict(node.meta)
        env[node] = placeholder
        input_specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(node.name), None))
    output_specs: list[Any] = []
    out_spec: Any = None
    for node in nodes:
        if node.op == "call_function":
            # named as torch.export names the nodes it traces (the op's name, numbered in graph
            # order: "dequantize_per_tensor_3", not convert's "dequantize_per_tensor_default_3"),
            # so the ONNX values, outputs included, keep the names the exporter's capture gave them
            copy = _copy_call(graph, node, env)
            copy.meta = dict(node.meta)
            if "nn_module_stack" not in copy.meta:
                # convert's quantize / dequantize nodes: the module of the value they carry (the
                # exporter names each ONNX node's scope from it, and logs a warning per node without)
                copy.meta["nn_module_stack"] = _module_stack(copy)
            env[node] = copy
        elif node.op == "output":
            results = [env[leaf] for leaf in _outputs(model, node)]
            graph.output(tuple(results))
            info = getattr(model.graph._codegen, "pytree_info", None)
            out_spec = info.out_spec if info is not None else torch.utils._pytree.tree_flatten(node.args[0])[1]
            output_specs = [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(r.name), None) for r in results]
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    # every value recomputed in one fake mode (convert's nodes carry none, or the float graph's)
    mode = FakeTensorMode()
    real = [
        (state_dict[s.target] if s.target in state_dict else constants[s.target])
        for s in input_specs
        if s.kind != InputKind.USER_INPUT
    ]
    with mode:
        FakeTensorProp(module, mode).propagate_dont_convert_inputs(
            *(mode.from_tensor(t, static_shapes=True) for t in [*real, *args])
        )
    signature = ModuleCallSignature(
        inputs=[],
        outputs=[],
        in_spec=torch.utils._pytree.tree_flatten((tuple(args), {}))[1],
        out_spec=out_spec,
        forward_arg_names=[n.name for n in user_inputs],
    )
    return ExportedProgram(
        root=module,
        graph=module.graph,
        graph_signature=ExportGraphSignature(input_specs, output_specs),
        state_dict=state_dict,
        range_constraints={},
        module_call_graph=[ModuleCallEntry("", signature)],
        constants=constants,
    )


def decompose_nodes(
    program: torch.export.ExportedProgram,
    nodes: Sequence[torch.fx.Node],
    table: Mapping[Any, Callable[..., Any]],
    translated: Callable[[Any], bool],
) -> bool:
    """Replace each of ``nodes`` (of ``program``'s graph, built by :func:`exported_program`) by
    its decomposition, traced alone (``make_fx`` with ``table`` on the node's fake inputs), in
    place: what ``run_decompositions`` does to those nodes, without re-tracing the rest. True when
    every op of the result is ``translated``; False (the caller then decomposes the whole program)
    when a node cannot be replaced so (an output, several results, a constant made by the
    decomposition) or its decomposition has untranslated ops."""
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = program.graph_module.graph
    outputs = set(graph.output_node().all_input_nodes)
    for node in nodes:
        inputs = node.all_input_nodes
        values = [n.meta.get("val") for n in inputs]
        if node in outputs or not inputs or not all(isinstance(v, torch.Tensor) for v in values):
            return False

        def alone(*tensors: torch.Tensor, node: torch.fx.Node = node, inputs: list[torch.fx.Node] = inputs) -> Any:
            bound = dict(zip(inputs, tensors, strict=True))
            args = torch.fx.map_arg(node.args, bound.__getitem__)
            kwargs = torch.fx.map_arg(node.kwargs, bound.__getitem__)
            return node.target(*args, **kwargs)  # type: ignore[operator]

        with values[0].fake_mode:  # type: ignore[union-attr]
            traced = make_fx(alone, decomposition_table=dict(table))(*values)
        body = list(traced.graph.nodes)
        result = body[-1].args[0]
        if not isinstance(result, torch.fx.Node) or any(
            n.op == "get_attr" or (n.op == "call_function" and not translated(n.target)) for n in body
        ):
            return False
        env: dict[torch.fx.Node, torch.fx.Node] = dict(
            zip((n for n in body if n.op == "placeholder"), inputs, strict=True)
        )
        with graph.inserting_before(node):
            for sub in body:
                if sub.op != "call_function":
                    continue
                new = _copy_call(graph, sub, env)
                new.meta = {k: v for k, v in node.meta.items() if k in ("nn_module_stack", "stack_trace")}
                new.meta["val"] = sub.meta["val"]
                env[sub] = new
        node.replace_all_uses_with(env[result])
        graph.erase_node(node)
    program.graph_module.recompile()
    return True

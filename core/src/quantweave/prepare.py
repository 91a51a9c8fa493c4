"""``prepare_pt2e``: annotate an exported model and insert observers.

Contract: the caller's module is never mutated. ``prepare_pt2e`` works on a copy of the
graph whose parameters and buffers are *shared* with the caller's module (no weight memory
is duplicated); batch-norm folding writes new attributes on the copy only, and annotations
are written on the copy's nodes only.

Flow: copy → in-place ops whose write no one sees as their functional ops (``x += y``
as ``x + y``, :mod:`quantweave._modules.functionalize`) → fold eval-mode BN into
conv/linear → ``quantizer.transform_for_annotation`` → ``quantizer.annotate`` →
``quantizer.validate`` → observer plan (sharing groups, fixed, derived) →
``quantizer.prepare_obs_or_fq_callback`` → observers inserted as
``activation_post_process_<i>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.fx import GraphModule, Node

from ._modules.bn_fold import fold_batch_norm
from ._modules.explained_guards import explain_guards
from ._modules.foreign import PT2E_HOOKS, check_observers, translate_annotations
from ._modules.functionalize import explain_left_in_place, functionalize_in_place
from ._modules.graph import (
    add_node,
    check_graph_module,
    copy_graph_module,
    get_attr_value,
    iter_input_nodes,
    port_meta,
    rebuild,
    remap_annotations,
    set_attr_value,
)
from ._modules.misuse import PREPARED_KEY, check_prepare_input
from ._modules.per_token import mark_per_token_observers
from ._modules.prepare_rules import drop_in_place_destinations, map_subgraphs
from ._modules.qat_conv_bn import simulate_conv_bn
from ._modules.sharing import collect_specs, describe, group_specs
from ._modules.spec_check import build_checked_observers
from ._modules.working_copy import handed_over
from .annotation import ANNOTATED_BY_KEY, ANNOTATION_KEY, EdgeOrNode, QuantizationAnnotation
from .errors import AnnotationError
from .training import disallow_eval_train

if TYPE_CHECKING:
    from .quantizer import Quantizer

__all__ = ["prepare_pt2e", "prepare_qat_pt2e", "OBSERVER_PREFIX"]

#: Name prefix of the observer submodules that prepare inserts.
OBSERVER_PREFIX = "activation_post_process_"


def prepare_pt2e(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    """Annotate ``model`` with ``quantizer`` and return a copy with observers inserted.

    ``model`` is the output of ``torch.export.export(m, args).module()``. Run calibration
    data through the result, then call :func:`quantweave.convert_pt2e`. ``model`` itself
    is left as it was (graph, attributes and node metadata).
    """
    return _prepare(model, quantizer, is_qat=False)


def prepare_qat_pt2e(model: GraphModule, quantizer: Quantizer) -> GraphModule:
    """Like :func:`prepare_pt2e` but inserts fake-quantize modules for QAT.

    Export the model in training mode. The quantizer's specs must use fake-quantize
    constructors (``observers.FakeQuantize.with_args(...)``); fixed-qparams specs become
    ``FixedQParamsFakeQuantize``. Batch norm is *not* folded, so it keeps training: each
    annotated ``conv -> batch_norm`` is rewritten so that the weight fake-quantizer sees
    the weight with batch norm folded in, and :func:`quantweave.convert_pt2e` folds it for
    real. The prepared model owns copies of ``model``'s parameters and buffers, so training
    it (including batch-norm statistics) leaves ``model`` as it was.
    """
    return _prepare(model, quantizer, is_qat=True)


def _check_quantizer(quantizer: object, api: str) -> None:
    missing = [hook for hook in PT2E_HOOKS if not callable(getattr(quantizer, hook, None))]
    if missing:
        raise TypeError(
            f"{api} expects a quantweave.Quantizer; got {type(quantizer).__name__} (no {', '.join(missing)} method)"
        )


def _hook(quantizer: Quantizer, hook: str, api: str, *args: Any) -> Any:
    """Call one of the quantizer's hooks; an exception it raises keeps its class and gets a
    note naming the quantizer and the hook."""
    try:
        return getattr(quantizer, hook)(*args)
    except Exception as exc:
        exc.add_note(f"raised in {hook}() of quantizer {_label(None, quantizer)!r}, called by quantweave.{api}")
        raise


def _prepare(model: GraphModule, quantizer: Quantizer, is_qat: bool) -> GraphModule:
    api = "prepare_qat_pt2e" if is_qat else "prepare_pt2e"
    check_graph_module(model, api)
    check_prepare_input(model, quantizer, api)
    _check_quantizer(quantizer, api)
    gm, node_map = copy_graph_module(model)
    # annotations made on the caller's graph before prepare name the caller's nodes: the
    # copy gets its own annotation objects, naming its own nodes
    remap_annotations(gm.graph, node_map)
    map_subgraphs(gm, api, lambda body: _prepare(body, quantizer, is_qat))  # scan / while_loop bodies
    functionalize_in_place(gm)  # x += y, relu_(x): annotated as add, relu where no one sees the write
    if is_qat:
        _own_tensors(gm)
    else:
        fold_batch_norm(gm)
    with handed_over(gm):  # nothing else holds gm: a rewrite may edit it in place (_modules/working_copy)
        transformed = _hook(quantizer, "transform_for_annotation", api, gm)
    if not isinstance(transformed, GraphModule):
        raise TypeError(
            f"{type(quantizer).__name__}.transform_for_annotation must return a GraphModule; "
            f"got {type(transformed).__name__}"
        )
    gm = transformed
    _hook(quantizer, "annotate", api, gm)
    _hook(quantizer, "validate", api, gm)
    translate_annotations(gm.graph, lambda node: _label(node, quantizer))  # torchao's classes -> ours
    explain_left_in_place(gm)  # an in-place op whose write is seen elsewhere: why no one quantized it
    if is_qat:
        simulate_conv_bn(gm)
    specs = collect_specs(gm.graph)
    _check_observed_tensors(gm, specs, quantizer)
    groups = group_specs(specs)  # sharing groups, once for every step below
    observers = build_checked_observers(gm, specs, is_qat, lambda key: _label(key, quantizer), groups)
    mark_per_token_observers(specs, observers, is_qat, lambda key: _label(key, quantizer), groups)
    _hook(quantizer, "prepare_obs_or_fq_callback", api, gm, observers)
    check_observers(observers, lambda key: _label(key, quantizer))
    _insert_observers(gm, drop_in_place_destinations(observers))  # a written buffer is written itself
    gm.meta[PREPARED_KEY] = api
    # code generated on first use; a batch of another size: how to export for it
    return disallow_eval_train(explain_guards(rebuild(gm, signature_from=model)))


def _own_tensors(gm: GraphModule) -> None:
    """Give the copy its own parameters and buffers (QAT trains them in place)."""
    with torch.no_grad():
        for name, param in list(gm.named_parameters()):
            set_attr_value(gm, name, torch.nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad))
        for name, buffer in list(gm.named_buffers()):
            set_attr_value(gm, name, buffer.detach().clone())


#: what quantize_per_tensor / quantize_per_channel accept (float16 and bfloat16 are widened)
_QUANTIZABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_observed_tensors(gm: GraphModule, specs: dict[EdgeOrNode, Any], quantizer: Quantizer) -> None:
    """A spec must sit on a float32 / bfloat16 / float16 tensor: anything else (a symbolic
    size, a list, an int or float64 tensor) would fail at calibration or at run time, far
    from the annotation. Raises AnnotationError naming the edge and the quantizer."""
    for key in specs:
        source = key[0] if isinstance(key, tuple) else key
        val = source.meta.get("val")
        if val is None and source.op == "get_attr":
            try:
                val = get_attr_value(gm, str(source.target))
            except AttributeError:
                val = None
        if val is None and "val" not in source.meta and source.op != "get_attr":
            continue  # made by a transform that recorded no value: nothing to check against
        if isinstance(val, torch.Tensor) and val.dtype in _QUANTIZABLE_DTYPES:
            continue
        what = f"a {val.dtype} tensor" if isinstance(val, torch.Tensor) else f"{type(val).__name__}, not a tensor"
        by = _label(key, quantizer)
        raise AnnotationError(
            f"{describe(key)}: quantizer {by!r} put a quantization spec on {source.name!r}, which is {what}; "
            "only float32, bfloat16 and float16 tensors can be quantized"
        )


def _label(key: EdgeOrNode | None, quantizer: Quantizer) -> str:
    if key is not None:
        node = key[1] if isinstance(key, tuple) else key
        by = node.meta.get(ANNOTATED_BY_KEY)
        if isinstance(by, str):
            return by
    name = getattr(quantizer, "name", None)
    return name if isinstance(name, str) and name else type(quantizer).__name__


def _is_tensor_output(node: Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor)


def _insert_observers(gm: GraphModule, observers: dict[EdgeOrNode, torch.nn.Module]) -> None:
    graph = gm.graph
    names: dict[int, str] = {}
    # (tensor node, observer id) -> observer node already reading that tensor
    existing: dict[tuple[Node, int], Node] = {}

    def observer_node(after: Node, observer: torch.nn.Module) -> Node:
        cached = existing.get((after, id(observer)))
        if cached is not None:
            return cached
        name = names.get(id(observer))
        if name is None:
            name = f"{OBSERVER_PREFIX}{len(names)}"
            names[id(observer)] = name
            gm.add_submodule(name, observer)
        with graph.inserting_after(after):  # call_module's check that the submodule exists: it was just added
            node = add_node(graph, "call_module", name, (after,))
        node.meta["val"] = after.meta.get("val")
        port_meta(after, node, ("stack_trace", "nn_module_stack"))
        existing[(after, id(observer))] = node
        return node

    # output observer node -> (the producer it observes, the observer module)
    observed_output: dict[Node, tuple[Node, torch.nn.Module]] = {}
    for node in list(graph.nodes):
        if not isinstance(node.meta.get(ANNOTATION_KEY), QuantizationAnnotation):
            continue
        replacements: dict[Node, Node] = {}
        for current in dict.fromkeys(iter_input_nodes((node.args, node.kwargs))):
            # once a producer's output is observed, its users read the observer node
            producer, current_observer = observed_output.get(current, (current, None))
            observer = observers.get((producer, node))
            if observer is None or observer is current_observer:
                continue  # not annotated, or the edge shares the producer's output observer
            replacements[current] = observer_node(current, observer)
        if replacements:
            node.args, node.kwargs = _substitute((node.args, node.kwargs), replacements)
        observer = observers.get(node)
        if observer is not None:
            if not _is_tensor_output(node):
                raise AnnotationError(
                    f"node {node.name!r}: an output spec needs a single tensor output; "
                    f"its output is {type(node.meta.get('val')).__name__}"
                )
            obs_node = observer_node(node, observer)
            for user in list(node.users):
                if user is not obs_node:
                    user.replace_input_with(node, obs_node)
            observed_output[obs_node] = (node, observer)


def _substitute(args: Any, replacements: dict[Node, Node]) -> Any:
    return torch.fx.node.map_arg(args, lambda n: replacements.get(n, n))

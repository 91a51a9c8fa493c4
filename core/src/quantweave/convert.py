"""``convert_pt2e``: turn a calibrated model's observers into quantize/dequantize ops.

The result is the *reference* representation that backends pattern-match:
``torch.ops.quantized_decomposed.quantize_per_tensor`` / ``dequantize_per_tensor`` (and the
``per_channel``, group-wise ``per_channel_group``, dynamic ``.tensor`` and dynamic per-token
``quantize_per_token`` / ``dequantize_per_token`` variants).
Constant inputs (weights, biases, and any transform of them) are quantized here, once, so
the converted model stores int8 weights followed by a ``dequantize`` node. Every user of a
dequantized tensor gets its own ``dequantize`` node, so each consumer can be fused
independently -- except a dynamically quantized tensor, whose one run-time
choose_qparams -> quantize -> dequantize is shared by its users.

Contract: the prepared model is not mutated; the same calibrated model can be converted
again (e.g. with ``fold_quantize=False``).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import GraphModule, Node

from ._modules.convert_rules import (
    convert_hook,
    fold_constant_quantizes,
    is_dynamic_dequantize,
    is_placeholder,
    mutable_attr_nodes,
    port_quantization_tags,
    replace_placeholder,
)
from ._modules.finite import remembering_proofs
from ._modules.graph import (
    add_node,
    check_graph_module,
    copy_graph_module,
    erase_dead,
    evaluate_constant,
    is_constant,
    new_attr_name,
    port_meta,
    rebuild,
    set_attr_value,
)
from ._modules.group_quantize import new_workspace, observed_nan_free, qparams_valid, quantize_weight
from ._modules.misuse import warn_no_observers
from ._modules.observer_calls import observer_calls
from ._modules.observer_copies import copy_observers
from ._modules.per_token import PER_TOKEN_ATTR
from ._modules.prepare_rules import map_subgraphs
from ._modules.qat_conv_bn import fold_simulated_conv_bn
from ._modules.qtypes import dtype_range, integer_dtype, is_integer_dtype, is_per_channel
from ._modules.reference_repr import to_reference_representation
from ._modules.torch_compat import quantized_decomposed_ops
from .annotation import PER_TOKEN_RANGE
from .errors import ConvertError, ObserverNotCalibratedError
from .observers import is_calibrated, is_observer_module
from .training import disallow_eval_train

__all__ = [
    "choose_qparams_ops",
    "convert_pt2e",
    "dequantize_ops",
    "quantize_ops",
]  # QUANTIZE_OPS/DEQUANTIZE_OPS via __getattr__


def quantize_ops() -> tuple[Any, ...]:
    """The quantize ops convert emits."""
    qd = quantized_decomposed_ops()
    return (
        qd.quantize_per_tensor.default,
        qd.quantize_per_tensor.tensor,
        qd.quantize_per_channel.default,
        qd.quantize_per_channel_group.default,
        qd.quantize_per_token.default,
    )


def dequantize_ops() -> tuple[Any, ...]:
    """The dequantize ops convert emits."""
    qd = quantized_decomposed_ops()
    return (
        qd.dequantize_per_tensor.default,
        qd.dequantize_per_tensor.tensor,
        qd.dequantize_per_channel.default,
        qd.dequantize_per_channel_group.default,
        qd.dequantize_per_token.default,
    )


def choose_qparams_ops() -> tuple[Any, ...]:
    """The ops convert emits to choose dynamic qparams at run time (their outputs are read
    through ``operator.getitem``: 0 the scale, 1 the zero point)."""
    qd = quantized_decomposed_ops()
    return (
        qd.choose_qparams.tensor,
        qd.choose_qparams_symmetric.tensor,
        qd.choose_qparams_per_token_asymmetric.default,
    )


def __getattr__(name: str) -> Any:  # QUANTIZE_OPS / DEQUANTIZE_OPS, computed on first access
    if name == "QUANTIZE_OPS":
        return quantize_ops()
    if name == "DEQUANTIZE_OPS":
        return dequantize_ops()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_CHOOSE_QPARAMS = {
    torch.per_tensor_affine: "choose_qparams",
    torch.per_tensor_symmetric: "choose_qparams_symmetric",
}


def convert_pt2e(
    model: GraphModule, fold_quantize: bool = True, *, use_reference_representation: bool = False
) -> GraphModule:
    """Replace observers with quantize/dequantize ops and return a new module.

    After ``prepare_qat_pt2e``, each conv/batch-norm pair rewritten for QAT is folded first
    (the batch norm's running statistics go into the conv). ``fold_quantize=True`` stores
    constant inputs (weights) already quantized; ``fold_quantize=False`` keeps them float
    parameters followed by quantize -> dequantize in the graph (the same integer values,
    rounded at run time), the form converters that match q/dq around weights need (the
    LiteRT converter rejects folded int8 weights).
    ``use_reference_representation=True`` writes the quantized ops in integer arithmetic
    with aten ops (int32 accumulation, requantization, q/dq as their arithmetic), as torchao's
    reference representation does; see ``quantweave._modules.reference_repr``.
    Raises :class:`ObserverNotCalibratedError` naming every observer that saw no data.
    """
    check_graph_module(model, "convert_pt2e")
    if not isinstance(fold_quantize, bool):
        raise TypeError(f"convert_pt2e: fold_quantize must be a bool; got {fold_quantize!r}")
    if not isinstance(use_reference_representation, bool):
        raise TypeError(
            f"convert_pt2e: use_reference_representation must be a bool; got {use_reference_representation!r}"
        )
    with remembering_proofs():  # an observer's range proven finite is not checked again in this call
        return _convert(model, fold_quantize, use_reference_representation)


def _convert(model: GraphModule, fold_quantize: bool, use_reference_representation: bool) -> GraphModule:
    gm, _ = copy_graph_module(model)
    map_subgraphs(
        gm,
        "convert_pt2e",
        lambda body: convert_pt2e(body, fold_quantize, use_reference_representation=use_reference_representation),
        warn=False,
    )
    fold_simulated_conv_bn(gm)
    observer_nodes = [node for node, _ in observer_calls(gm, _is_observer)]
    if not observer_nodes:
        warn_no_observers(gm)
    before = set(gm.graph.nodes)
    constant_cache: dict[Node, bool] = mutable_attr_nodes(gm.graph)  # written in place: never folded
    constant_values: dict[Node, Any] = {}
    _observe_constants(gm, observer_nodes, constant_cache, constant_values)
    _check_calibrated(gm, observer_nodes)
    folded_inputs: list[Node] = []
    run = _Run(gm, constant_values)
    hook_nodes: list[Node] = []
    for node in observer_nodes:
        module = gm.get_submodule(str(node.target))
        hook = convert_hook(module)
        if hook is not None:  # an observer that converts itself (torchao's affine observers)
            known = set(gm.graph.nodes)
            hook(gm, node)
            hook_nodes.extend(n for n in gm.graph.nodes if n not in known)
            continue
        source = node.args[0]
        assert isinstance(source, Node)
        fold = fold_quantize and is_constant(source, constant_cache)
        _replace_observer(gm, node, module, fold, run)
        if fold:
            folded_inputs.append(source)
    if fold_quantize and hook_nodes:
        folded_inputs += fold_constant_quantizes(
            gm,
            hook_nodes,
            lambda n: is_constant(n, constant_cache),
            lambda n: evaluate_constant(gm, n, constant_values),
        )
    erase_dead(gm.graph, folded_inputs)  # float weight chains the folding left without users
    _one_dequantize_per_user(gm)
    port_quantization_tags(gm.graph, [n for n in gm.graph.nodes if n not in before], dequantize_ops())
    if use_reference_representation:
        to_reference_representation(gm)
    # code generated on first use; the graph linted where an observer's convert hook (not
    # this package's code) edited it
    return disallow_eval_train(rebuild(gm, signature_from=model, lint=bool(hook_nodes)))


def _is_observer(module: torch.nn.Module) -> bool:
    return is_observer_module(module) or convert_hook(module) is not None


def _observe_constants(
    gm: GraphModule,
    observer_nodes: list[Node],
    constant_cache: dict[Node, bool],
    constant_values: dict[Node, Any],
) -> None:
    """Weights need no calibration data: observers of constants that saw nothing observe
    the constant now. They are copies, so the prepared model's observers stay as they were
    (copied with the observers linked to them, so derived observers keep pointing at their
    sources: ``_modules/observer_copies``)."""
    pending = [
        n
        for n in observer_nodes
        if is_constant(n.args[0], constant_cache)  # type: ignore[arg-type]
        and not is_calibrated(gm.get_submodule(str(n.target)))
    ]
    if not pending:
        return
    names = sorted({str(n.target) for n in observer_nodes})
    copies = copy_observers({name: gm.get_submodule(name) for name in names}, {str(n.target) for n in pending})
    for name, module in copies.items():
        set_attr_value(gm, name, module)
    with torch.no_grad():
        for node in pending:
            source = node.args[0]
            assert isinstance(source, Node)
            copies[str(node.target)](evaluate_constant(gm, source, constant_values))


def _check_calibrated(gm: GraphModule, observer_nodes: list[Node]) -> None:
    missing: dict[str, list[str]] = {}
    for node in observer_nodes:
        if not is_calibrated(gm.get_submodule(str(node.target))):
            source = node.args[0]
            missing.setdefault(str(node.target), []).append(getattr(source, "name", str(source)))
    if missing:
        listing = "; ".join(
            f"{name} (observes {', '.join(repr(s) for s in sources)}){_non_finite(gm.get_submodule(name))}"
            for name, sources in missing.items()
        )
        raise ObserverNotCalibratedError(
            f"convert_pt2e: {len(missing)} observer(s) never saw data: {listing}. "
            "Run calibration inputs through the prepared model before converting."
        )


def _non_finite(module: torch.nn.Module) -> str:
    """``" saw only NaN / inf values"`` for an observer that saw data, none of it finite."""
    inner = getattr(module, "activation_post_process", module)
    low, high = getattr(inner, "min_val", None), getattr(inner, "max_val", None)
    if not (isinstance(low, torch.Tensor) and isinstance(high, torch.Tensor) and low.numel() and high.numel()):
        return ""
    if bool(torch.isnan(low).any() or torch.isnan(high).any() or (low <= high).any()):
        return " saw only NaN / inf values (the float model computes them on the calibration data)"
    return ""


def _quant_settings(module: torch.nn.Module) -> tuple[Any, ...]:
    """(dtype, qscheme, quant_min, quant_max) of an observer, with torch.q* dtypes unwrapped."""
    dtype = integer_dtype(getattr(module, "dtype", None))
    qscheme = getattr(module, "qscheme", torch.per_tensor_affine)
    quant_min = getattr(module, "quant_min", None)
    quant_max = getattr(module, "quant_max", None)
    if quant_min is None or quant_max is None:
        if not is_integer_dtype(dtype):
            return dtype, qscheme, 0, 0
        lo, hi = dtype_range(dtype)
        quant_min = lo if quant_min is None else quant_min
        quant_max = hi if quant_max is None else quant_max
    return dtype, qscheme, int(quant_min), int(quant_max)


#: qparams of fewer elements are copied without looking for what else holds them (a copy of a
#: few KB costs less than the look)
_COPIED_ANYWAY = 4096


class _Run:
    """What one convert call keeps between the observers it replaces."""

    def __init__(self, gm: GraphModule, constant_values: dict[Node, Any]) -> None:
        self.gm = gm
        self.constant_values = constant_values
        # one observer module may sit at several nodes (sharing); its qparams are computed once
        self.qparams: dict[int, tuple[Any, Any]] = {}
        self.workspace = new_workspace()  # every weight is quantized in this one block buffer
        self.taken_below: dict[str, int] = {}  # names of the frozen weights: each search starts after the last one
        self._held: set[int] | None = None
        self._observers_held: dict[int, set[int]] = {}

    def own_buffer(self, value: Any, observer: torch.nn.Module) -> torch.Tensor:
        """``value`` (an observer's scale or zero point) as a tensor the converted model may own:
        itself when no other tensor the module holds shares its storage, else a copy. The
        qparams an observer computes are new tensors, and copying them cost a 4-bit LLM's
        convert a fresh allocation (page faults and all) per group-wise weight (issue 25). A
        copy is made for a tensor sharing storage with one the module holds (an observer's own
        buffer or attribute, a weight, qparams registered before: an observer shared by several
        nodes), so ``load_state_dict`` on the converted model writes into nothing else; and for
        a small (:data:`_COPIED_ANYWAY`: empty included) tensor or a value that is not a tensor."""
        tensor = torch.as_tensor(value).detach()
        if tensor.numel() < _COPIED_ANYWAY:
            return tensor.clone()
        held = self._storages_held()
        if id(observer) not in self._observers_held:  # read once its qparams are computed
            self._observers_held[id(observer)] = _storages(observer)
        address = tensor.untyped_storage().data_ptr()
        if (
            isinstance(value, torch.Tensor)
            and address not in held
            and address not in self._observers_held[id(observer)]
        ):
            held.add(address)
            return tensor
        return tensor.clone()

    def _storages_held(self) -> set[int]:
        """Storage addresses of the tensors the module and its submodules (observers included)
        hold, as parameters, buffers or plain attributes; read on first use, then kept up to date
        by :meth:`own_buffer` (which also reads the observer at hand again: its
        ``calculate_qparams`` may have stored new tensors)."""
        if self._held is None:
            self._held = _storages(self.gm)
        return self._held


def _storages(module: torch.nn.Module) -> set[int]:
    """Storage addresses of the tensors ``module`` and its submodules hold as parameters,
    buffers or plain attributes (one walk of the submodules)."""
    held: set[int] = set()
    for submodule in module.modules():
        for values in (submodule._parameters.values(), submodule._buffers.values(), vars(submodule).values()):
            held.update(v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor))
    return held


def _replace_observer(gm: GraphModule, node: Node, module: torch.nn.Module, fold: bool, run: _Run) -> None:
    graph = gm.graph
    _qd = quantized_decomposed_ops()
    source = node.args[0]
    assert isinstance(source, Node)
    name = str(node.target)
    dtype, qscheme, quant_min, quant_max = _quant_settings(module)
    if is_placeholder(dtype):  # a float PlaceholderObserver: the tensor stays float
        replace_placeholder(graph, node, source, dtype)
        return
    dq_kwargs: dict[str, Any] = {}
    val = source.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dtype != torch.float32:
        dq_kwargs["out_dtype"] = val.dtype

    if getattr(module, PER_TOKEN_ATTR, False):
        _insert_per_token(graph, node, source, (quant_min, quant_max), dtype, val)
        return

    if getattr(module, "is_dynamic", False):
        if qscheme not in _CHOOSE_QPARAMS:
            raise ConvertError(
                f"{name} (observes {source.name!r}): dynamic quantization needs a per-tensor qscheme; got {qscheme}"
            )
        eps = getattr(module, "eps", None)
        eps = float(torch.finfo(torch.float32).eps) if eps is None else float(eps)
        with graph.inserting_before(node):
            choose_op = getattr(_qd, _CHOOSE_QPARAMS[qscheme]).tensor
            choose = add_node(graph, "call_function", choose_op, (source, quant_min, quant_max, eps, dtype))
            scale = add_node(graph, "call_function", operator.getitem, (choose, 0))
            zero_point = add_node(graph, "call_function", operator.getitem, (choose, 1))
            dyn_args = (scale, zero_point, quant_min, quant_max, dtype)
            quant = add_node(graph, "call_function", _qd.quantize_per_tensor.tensor, (source, *dyn_args))
            dequant = add_node(graph, "call_function", _qd.dequantize_per_tensor.tensor, (quant, *dyn_args), dq_kwargs)
        for new in (choose, scale, zero_point, quant, dequant):
            port_meta(source, new)
        dequant.meta["val"] = val
        node.replace_all_uses_with(dequant)
        graph.erase_node(node)
        return

    q_args: tuple[Any, ...]
    if id(module) not in run.qparams:
        run.qparams[id(module)] = _qparams(module, name, source)
    scale_t, zero_point_t = run.qparams[id(module)]
    group_size = getattr(module, "group_size", None)
    dq_extra: tuple[Any, ...] = ()
    if group_size is not None:  # group-wise: (rows, groups) qparams, groups along the last dimension
        scale_node, zp_node = _qparam_buffers(run, node, module, scale_t, zero_point_t)
        q_args = (scale_node, zp_node, quant_min, quant_max, dtype, int(group_size))
        q_op, dq_op = _qd.quantize_per_channel_group.default, _qd.dequantize_per_channel_group.default
        dq_extra = (dq_kwargs.pop("out_dtype", torch.float32),)  # output_dtype is positional here
    elif is_per_channel(qscheme):
        axis = int(module.ch_axis)  # type: ignore[arg-type]
        scale_node, zp_node = _qparam_buffers(run, node, module, scale_t, zero_point_t)
        q_args = (scale_node, zp_node, axis, quant_min, quant_max, dtype)
        q_op, dq_op = _qd.quantize_per_channel.default, _qd.dequantize_per_channel.default
    else:
        q_args = (float(scale_t), int(zero_point_t), quant_min, quant_max, dtype)
        q_op, dq_op = _qd.quantize_per_tensor.default, _qd.dequantize_per_tensor.default

    with graph.inserting_before(node):
        if fold:
            values = torch.fx.node.map_arg(q_args, lambda n: evaluate_constant(gm, n, run.constant_values))
            with torch.no_grad():
                weight = evaluate_constant(gm, source, run.constant_values)
                nan_free = group_size is not None and observed_nan_free(module, weight)
                qvalue = quantize_weight(q_op, weight, values, run.workspace, nan_free=nan_free)
            q_name = new_attr_name(gm, "_frozen_param", run.taken_below)
            gm.register_buffer(q_name, qvalue)
            quant = graph.create_node("get_attr", q_name)  # registered just above: get_attr's look-up skipped
        else:
            quant = add_node(graph, "call_function", q_op, (source, *q_args))
        dequant = add_node(graph, "call_function", dq_op, (quant, *q_args, *dq_extra), dq_kwargs)
    for new in (quant, dequant):
        port_meta(source, new)
    dequant.meta["val"] = val
    node.replace_all_uses_with(dequant)
    graph.erase_node(node)


def _qparam_buffers(run: _Run, node: Node, observer: torch.nn.Module, scale: Any, zero_point: Any) -> tuple[Node, Node]:
    """Per-channel / per-group qparams of ``observer`` (at ``node``) as buffers of the module,
    read by get_attr nodes before ``node``."""
    gm, name = run.gm, str(node.target)
    scale_name = new_attr_name(gm, f"{name}_scale_")
    zp_name = new_attr_name(gm, f"{name}_zero_point_")
    gm.register_buffer(scale_name, run.own_buffer(scale, observer))
    gm.register_buffer(zp_name, run.own_buffer(zero_point, observer))
    with gm.graph.inserting_before(node):
        # registered just above: the get_attr nodes made without get_attr's look-up of the names
        return gm.graph.create_node("get_attr", scale_name), gm.graph.create_node("get_attr", zp_name)


def _insert_per_token(
    graph: torch.fx.Graph, node: Node, source: Node, bounds: tuple[int, int], dtype: torch.dtype, val: Any
) -> None:
    """Replace the observer ``node`` of a per-token dynamic spec: qparams per token (row over
    the last dimension) chosen at run time, quantize and dequantize per token."""
    _qd = quantized_decomposed_ops()
    if bounds != PER_TOKEN_RANGE or dtype != torch.int8:
        raise ConvertError(
            f"{node.target} (observes {source.name!r}): per-token dynamic quantization is int8 in "
            f"{list(PER_TOKEN_RANGE)} (the range choose_qparams_per_token_asymmetric chooses for); the observer has "
            f"{dtype} in {list(bounds)}"
        )
    out_dtype = val.dtype if isinstance(val, torch.Tensor) else torch.float32
    with graph.inserting_before(node):
        choose = add_node(graph, "call_function", _qd.choose_qparams_per_token_asymmetric.default, (source, dtype))
        scale = add_node(graph, "call_function", operator.getitem, (choose, 0))
        zero_point = add_node(graph, "call_function", operator.getitem, (choose, 1))
        args = (scale, zero_point, *bounds, dtype)
        quant = add_node(graph, "call_function", _qd.quantize_per_token.default, (source, *args))
        dequant = add_node(graph, "call_function", _qd.dequantize_per_token.default, (quant, *args, out_dtype))
    for new in (choose, scale, zero_point, quant, dequant):
        port_meta(source, new)
    dequant.meta["val"] = val
    node.replace_all_uses_with(dequant)
    graph.erase_node(node)


def _qparams(module: torch.nn.Module, name: str, source: Node) -> tuple[Any, Any]:
    """The observer's (scale, zero_point); a failing calculation (e.g. a derived spec's
    function) or a scale that is not positive and finite raises ConvertError naming both."""
    where = f"{name} (observes {source.name!r})"
    try:
        scale, zero_point = module.calculate_qparams()  # type: ignore[operator]
    except Exception as exc:
        raise ConvertError(f"{where}: calculate_qparams failed: {type(exc).__name__}: {exc}") from exc
    if not qparams_valid(scale, positive=True):
        raise ConvertError(f"{where}: scale must be positive and finite; got {scale!r}")
    if not qparams_valid(zero_point, positive=False):
        raise ConvertError(f"{where}: zero_point must be finite; got {zero_point!r}")
    return scale, zero_point


def _one_dequantize_per_user(gm: GraphModule) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in dequantize_ops() or is_dynamic_dequantize(node):
            continue  # (a dynamically quantized tensor keeps one dequantize, shared by its users)
        users = list(node.users)
        for user in users[1:]:
            with graph.inserting_after(node):
                copy = graph.node_copy(node)
            user.replace_input_with(node, copy)

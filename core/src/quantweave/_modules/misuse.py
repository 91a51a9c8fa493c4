"""Misuse answered with a message about the misuse (issue #20).

The checks the public entry points make before doing anything, so that a call that cannot
be meant raises an error saying what was passed and what to pass instead, and a call that
would silently do nothing warns (:class:`~quantweave.errors.MisuseWarning`):

* :func:`check_prepare_input` -- a quantizer class instead of an instance; a GraphModule
  that did not come from ``torch.export`` (``torch.fx.symbolic_trace``: no tensor metadata,
  so no quantizer can match anything); a model that is already prepared, or converted;
* :func:`warn_no_observers` -- ``convert_pt2e`` on a model with no observers;
* :func:`quantizer_members` -- ``ComposableQuantizer`` given one quantizer, a name or a
  class instead of a list of instances;
* :func:`not_an_instance` -- the message for a class passed where an instance is expected.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from torch.fx import GraphModule

from ..errors import MisuseWarning
from .foreign import is_pt2e_quantizer
from .observer_calls import observer_calls

__all__ = ["PREPARED_KEY", "check_prepare_input", "not_an_instance", "quantizer_members", "warn_no_observers"]

#: ``GraphModule.meta`` key prepare sets on the model it returns (the API that prepared it):
#: ``convert_pt2e`` finding no observer on such a model is the quantizer's choice, not misuse
PREPARED_KEY = "quantweave_prepared_by"


def not_an_instance(value: object, where: str) -> str | None:
    """The message for ``where`` given a class instead of an instance (None if it is not a class)."""
    if not isinstance(value, type):
        return None
    name = value.__name__
    return f"{where} expects a quantizer instance; got the class {name} itself: pass {name}() (an instance)"


def check_prepare_input(model: GraphModule, quantizer: object, api: str) -> None:
    """Raise TypeError for a quantizer class; ValueError for a model that did not come from
    ``torch.export`` or that is already prepared (naming its first observer)."""
    message = not_an_instance(quantizer, api)
    if message is not None:
        raise TypeError(message)
    _check_exported(model, api)
    _check_not_prepared(model, api)
    _check_not_converted(model, api)


def _check_exported(model: GraphModule, api: str) -> None:
    nodes = [n for n in model.graph.nodes if n.op != "output"]
    if not nodes or any("val" in n.meta for n in nodes):
        return
    raise ValueError(
        f"{api}: the GraphModule has no tensor metadata (node.meta['val'] is missing on all {len(nodes)} "
        "of its nodes), so it did not come from torch.export (torch.fx.symbolic_trace makes such graphs) and "
        "no quantizer could match its ops; export the model with torch.export.export(model, args).module() and "
        f"pass that to {api}"
    )


def _observer_nodes(model: GraphModule) -> list[tuple[str, str]]:
    """(observer name, name of the node it observes) of each observer call in ``model``."""
    return [
        (str(node.target), getattr(node.args[0] if node.args else None, "name", "?"))
        for node, _ in observer_calls(model)
    ]


def _check_not_prepared(model: GraphModule, api: str) -> None:
    found = _observer_nodes(model)
    if not found:
        return
    name, source = found[0]
    raise ValueError(
        f"{api}: the model is already prepared: it holds {len(found)} observer(s), e.g. {name!r} observing "
        f"{source!r}; prepare the exported model once (torch.export.export(model, args).module()), calibrate the "
        "prepared model, then call convert_pt2e on it"
    )


def _quantize_nodes(model: GraphModule) -> list[str]:
    """Names of the ``quantized_decomposed`` (quantize / dequantize) nodes of ``model``."""
    return [
        n.name
        for n in model.graph.nodes
        if n.op == "call_function" and getattr(n.target, "namespace", None) == "quantized_decomposed"
    ]


def _check_not_converted(model: GraphModule, api: str) -> None:
    found = _quantize_nodes(model)
    if not found:
        return
    raise ValueError(
        f"{api}: the model is already converted: it holds {len(found)} quantize/dequantize node(s), e.g. "
        f"{found[0]!r} (convert_pt2e or quantweave.load returned it); prepare the float exported model "
        "(torch.export.export(model, args).module()) instead, or use the converted model as it is"
    )


def warn_no_observers(model: GraphModule) -> None:
    """``convert_pt2e`` found no observer: unless the model comes from prepare (whose quantizer
    then annotated nothing: ``quantweave.annotation_report`` says why), say why nothing gets
    quantized (MisuseWarning)."""
    quantized = _quantize_nodes(model)
    if quantized:
        why = (
            f"it is converted already (it holds quantize/dequantize ops, e.g. {quantized[0]!r}); convert the "
            "prepared model, once"
        )
    elif PREPARED_KEY not in model.meta:
        why = (
            "it was not prepared: call prepare_pt2e (or prepare_qat_pt2e) on the exported model, calibrate the "
            "model it returns, then convert that one"
        )
    else:
        return
    warnings.warn(
        f"convert_pt2e: the model has no observers, so nothing is quantized and a float copy is returned: {why}",
        MisuseWarning,
        stacklevel=3,
    )


def quantizer_members(quantizers: Any, quantizer_type: type) -> list[Any]:
    """The members of a ``ComposableQuantizer``: a list (or other iterable) of quantizer
    instances (quantweave's, or any object with the PT2E quantizer hooks, such as a torchao
    ``Quantizer``). TypeError naming what was given instead."""
    where = "ComposableQuantizer"
    if isinstance(quantizers, quantizer_type) or (not isinstance(quantizers, type) and is_pt2e_quantizer(quantizers)):
        raise TypeError(
            f"{where} takes a list of quantizers; got a single {type(quantizers).__name__}: pass [quantizer] "
            "(or use the quantizer on its own)"
        )
    if isinstance(quantizers, type):
        name = quantizers.__name__
        raise TypeError(f"{where} takes a list of quantizer instances; got the class {name} itself: pass [{name}()]")
    if isinstance(quantizers, (str, bytes)) or not isinstance(quantizers, Iterable):
        raise TypeError(f"{where} takes a list of quantizer instances; got {type(quantizers).__name__} {quantizers!r}")
    members = list(quantizers)
    for index, member in enumerate(members):
        message = not_an_instance(member, f"{where} member {index}")
        if message is not None:
            raise TypeError(message)
        if not isinstance(member, quantizer_type) and not is_pt2e_quantizer(member):
            hint = f" (build it with quantweave.get_quantizer({member!r}))" if isinstance(member, str) else ""
            raise TypeError(
                f"{where} member {index} must be a quantweave.Quantizer; got {type(member).__name__}{hint} (an object "
                "with the PT2E quantizer hooks annotate, validate, transform_for_annotation and "
                "prepare_obs_or_fq_callback, such as a torchao Quantizer, is taken too)"
            )
    return members

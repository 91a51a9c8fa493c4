"""Every private or deprecated torch API quantweave's core depends on, in one place.

The rest of the core uses public torch only (``torch.export``, ``torch.fx`` Graph /
GraphModule / Node, the ``torch.ops.aten`` and ``torch.ops.quantized_decomposed`` op sets,
``torch.nn.utils.fusion``). What it cannot do with public API goes through the functions
and names below; each has a test in ``tests/core/test_torch_compat.py`` that fails, naming
the torch API and this module, on a torch that changed it:

1. :func:`quantized_decomposed_ops` -- the ``quantized_decomposed`` op library is
   registered by importing the private module ``torch.ao.quantization.fx._decomposed``.
2. :func:`empty_graph_like` -- a new fx Graph with another graph's tracer class and code
   generator: reads ``Graph._tracer_cls`` and ``Graph._codegen`` (the pytree in/out specs
   of an exported module live in its ``_PyTreeCodeGen``).
3. :func:`lazy_graph_module` -- ``torch.fx._lazy_graph_module._LazyGraphModule``, a
   GraphModule that generates its Python code on first use; :func:`deferred_graph_module`,
   a subclass of it for the modules prepare and convert return (hooks run once on the first
   call, ``forward``'s signature known before the code is generated, ``recompile()`` eager).
4. Observer and fake-quantize classes from ``torch.ao.quantization.observer`` /
   ``.fake_quantize`` (public names of a module torch no longer develops), and
   :func:`with_observer_kwargs`, which relies on ``.with_args`` partials (torch's private
   ``_PartialWrapper``) chaining, later keywords winning.
5. :class:`HistogramObserverHooks` -- torch's ``HistogramObserver`` with its private
   min/max search (``_non_linear_param_search``) and error function
   (``_compute_quantization_error``) exposed under our names, for the faster search of
   :class:`quantweave.observers.HistogramObserver`.
6. :func:`rebin_histogram` -- ``HistogramObserver._combine_histograms`` (private): maps a
   histogram onto a wider range exactly as the observer does when a batch widens its range,
   for merging the histograms of several processes (:mod:`quantweave.distributed`).
8. :func:`fake_value` -- a ``FakeTensor`` for ``node.meta["val"]`` of a node a transform
   adds, made by the fake mode of the graph's other values (``FakeTensor.fake_mode`` and
   ``FakeTensorMode.from_tensor``, private API of ``torch._subclasses``), as torch.export
   records for its own nodes.
7. :func:`segment_sum` -- ``torch.segment_reduce`` (documented, but marked beta): sums of
   contiguous runs in index order, for re-binning a histogram the way ``bincount`` does
   without its per-element scatter; ``bincount`` when torch no longer has it.
9. :func:`pt2_packager` -- ``torch.export.pt2_archive._package`` (private): its
   ``_get_raw_tensor_bytes`` and ``PT2ArchiveWriter.write_bytes``, which
   ``_modules/archive_stream`` replaces while ``quantweave.save`` runs so that each weight is
   written from its storage (None on a torch without them: then torch saves as it does).
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.ao.quantization.fake_quantize import (
    FakeQuantize,
    FakeQuantizeBase,
    FixedQParamsFakeQuantize,
    FusedMovingAvgObsFakeQuantize,
)
from torch.ao.quantization.observer import (
    FixedQParamsObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from torch.fx import Graph, GraphModule

from .graph_module_attrs import construct
from .pickling import RefusesPickling

__all__ = [
    "FakeQuantize",
    "FakeQuantizeBase",
    "FixedQParamsFakeQuantize",
    "FixedQParamsObserver",
    "FusedMovingAvgObsFakeQuantize",
    "HistogramObserver",
    "HistogramObserverHooks",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "ObserverBase",
    "PerChannelMinMaxObserver",
    "PlaceholderObserver",
    "empty_graph_like",
    "fake_value",
    "deferred_graph_module",
    "lazy_graph_module",
    "pt2_packager",
    "quantized_decomposed_ops",
    "rebin_histogram",
    "segment_sum",
    "unguarded_module",
    "with_observer_kwargs",
]


def unguarded_module(program: Any) -> GraphModule:
    """``program.module()`` without the input-guard call (``check_guards=False``, which torch
    2.13 adds as a ``_guards_fn`` node); a torch without the keyword has no such call."""
    try:
        return program.module(check_guards=False)
    except TypeError:
        return program.module()


# -- 1. the quantized_decomposed op set ----------------------------------------------------


@functools.cache
def quantized_decomposed_ops() -> Any:
    """``torch.ops.quantized_decomposed`` with its ops registered.

    torch registers the library as a side effect of importing the private module
    ``torch.ao.quantization.fx._decomposed``; done on first use, so that ``import
    quantweave`` stays cheap.
    """
    import torch.ao.quantization.fx._decomposed  # registers the ops as a side effect

    return torch.ops.quantized_decomposed


# -- 2. fx graph internals -------------------------------------------------------------------


def empty_graph_like(graph: Graph) -> Graph:
    """A new, empty Graph with ``graph``'s tracer class and code generator.

    The code generator carries an exported module's pytree input/output specs (immutable,
    so it is shared, not copied); without it a copy would take and return flat tensors.
    """
    new = Graph(tracer_cls=graph._tracer_cls)
    new.set_codegen(graph._codegen)
    return new


def lazy_graph_module(root: torch.nn.Module, graph: Graph) -> GraphModule:
    """A GraphModule whose Python code is generated on first call (or ``.code``), not on
    construction. Falls back to an eager GraphModule if torch no longer has the lazy one
    (correct, only slower; ``tests/core/test_torch_compat.py`` reports it)."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # pragma: no cover - a torch without it: compile eagerly
        return GraphModule(root, graph)
    return construct(_LazyGraphModule, root, graph)  # attributes copied in fewer steps


_DEFERRING = threading.local()


def deferred_graph_module(root: GraphModule, graph: Graph, signature_from: torch.nn.Module) -> GraphModule:
    """A GraphModule over ``graph`` (attributes from ``root``) whose Python code is generated
    when it is first needed -- called, ``.code`` / ``print``, ``inspect.signature(m.forward)``,
    pickled -- not on construction, like torch's ``_LazyGraphModule`` but fit to be returned to
    a caller:

    - forward hooks (and pre-hooks) run once on the first call (``_LazyGraphModule``'s first
      call re-enters ``__call__``: every hook ran twice);
    - ``forward``'s signature is the generated code's before it is generated, so what reads it
      (``torch.export``'s argument names, ``quantweave.calibrate``'s input binding) sees what an
      eager module shows: it is taken from ``signature_from``'s ``forward`` -- whose graph has
      the same placeholders and the same code generator, hence the same ``def`` line;
    - ``_in_spec`` / ``_out_spec`` are set at once (an eager GraphModule sets them on compile);
    - ``recompile()`` after an edit generates the code at once and returns it, as GraphModule's.

    Eager (a ``GraphModule``) when that signature cannot be vouched for (another code
    generator or other placeholders than ``signature_from``'s graph, no signature) or torch no
    longer has ``_LazyGraphModule``. Either way pickling it raises a TypeError that says what
    to use instead (``pickling.RefusesPickling``)."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # pragma: no cover - a torch without it: compile eagerly
        return _eager_class()(root, graph)
    signature = _forward_signature(graph, signature_from)
    if signature is None:
        return _eager_class()(root, graph)
    cls = _deferred_class(_LazyGraphModule)
    _DEFERRING.active = True
    try:
        module = construct(cls, root, graph)  # attributes copied in fewer steps
    finally:
        _DEFERRING.active = False
    instance_cls: Any = type(module)  # GraphModule makes a class per instance

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.real_recompile()  # installs the generated forward on the instance's class
        return type(self).forward(self, *args, **kwargs)  # not self(...): hooks ran already

    forward.__signature__ = signature  # type: ignore[attr-defined]
    instance_cls._lazy_forward = forward
    instance_cls.forward = forward
    codegen = graph._codegen
    info = getattr(codegen, "pytree_info", None)
    if info is not None:  # what GraphModule.recompile sets for a pytree code generator
        module._in_spec = info.in_spec
        module._out_spec = info.out_spec
    return module


def _forward_signature(graph: Graph, source: torch.nn.Module) -> Any:
    """``inspect.signature`` of ``type(source).forward`` (with ``self``) when ``graph`` would
    generate the same ``def`` line as ``source``'s graph, else None."""
    source_graph = getattr(source, "graph", None)
    if not isinstance(source_graph, Graph) or source_graph._codegen is not graph._codegen:
        return None
    if [(n.target, n.args) for n in source_graph.find_nodes(op="placeholder")] != [
        (n.target, n.args) for n in graph.find_nodes(op="placeholder")
    ]:
        return None
    if not hasattr(source, "_code"):  # a lazy module not generated yet, other than ours
        function = type(source).__dict__.get("forward")
        signature = getattr(function, "__signature__", None)
        return signature if isinstance(signature, inspect.Signature) else None
    try:
        return inspect.signature(type(source).forward)
    except (TypeError, ValueError):  # pragma: no cover
        return None


@functools.cache
def _deferred_class(base: type) -> type:
    class DeferredGraphModule(RefusesPickling, base):
        """See :func:`deferred_graph_module`."""

        def recompile(self) -> Any:
            if getattr(_DEFERRING, "active", False):  # construction: generated on first use
                type(self).forward = type(self)._lazy_forward
                return None
            return self._real_recompile()

    DeferredGraphModule.__module__ = __name__
    return DeferredGraphModule


@functools.cache
def _eager_class() -> type:
    class EagerGraphModule(RefusesPickling, GraphModule):
        """A GraphModule :func:`deferred_graph_module` returns eagerly (it refuses pickling too)."""

    EagerGraphModule.__module__ = __name__
    return EagerGraphModule


def fake_value(graph: Graph, tensor: torch.Tensor) -> Any:
    """A FakeTensor like ``tensor`` (same shape, strides, dtype, device), in the fake mode of
    the first value recorded in ``graph`` (``node.meta["val"]``), for the ``meta["val"]`` of a
    node a transform adds; None when the graph records no fake value (not from torch.export)."""
    for node in graph.nodes:
        mode = getattr(node.meta.get("val"), "fake_mode", None)
        if mode is not None and callable(getattr(mode, "from_tensor", None)):
            return mode.from_tensor(tensor, static_shapes=True)
    return None


# -- 4. observer constructors ----------------------------------------------------------------


def with_observer_kwargs(ctr: Callable[..., Any], kwargs: dict[str, Any]) -> Callable[[], Any]:
    """A zero-argument constructor: ``ctr`` with ``kwargs`` added, ``kwargs`` winning.

    ``ctr`` is an observer / fake-quantize class, its ``.with_args(...)`` (torch's
    ``_PartialWrapper``, which chains) or any other callable.
    """
    if hasattr(ctr, "with_args"):
        built: Callable[[], Any] = ctr.with_args(**kwargs)
        return built
    return functools.partial(ctr, **kwargs)


# -- 5. HistogramObserver's private search ------------------------------------------------------


class HistogramObserverHooks(HistogramObserver):
    """torch's HistogramObserver whose private min/max search calls :meth:`search_min_max`.

    Subclasses override :meth:`search_min_max` (by default torch's own search) and may call
    :meth:`quantization_error`; they read the public state ``histogram``, ``bins``,
    ``min_val`` and ``max_val``.
    """

    def _non_linear_param_search(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.search_min_max()

    def search_min_max(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (min, max) to quantize to, from the histogram (torch's search here)."""
        return super()._non_linear_param_search()

    def quantization_error(self, start_bin: int, end_bin: int) -> float:
        """The L2 quantization error of keeping only bins ``start_bin..end_bin``: torch's
        value, bit for bit, wherever it is finite. torch sums ``density * (end**3 -
        begin**3) / 3`` in float32, which overflows once a clipped bin lies ~7e12 from the
        kept range (values near 1e13): the error becomes NaN, the search never stops, and
        the range shrinks to a sliver (SQNR 0 dB; torch and torchao 0.18 do this). Then the
        same sum is taken in float64."""
        error = float(self._compute_quantization_error(start_bin, end_bin))
        if math.isfinite(error):
            return error
        return _quantization_error_float64(
            self.histogram, float(self.min_val), float(self.max_val), self.dst_nbins, start_bin, end_bin
        )


def _quantization_error_float64(
    histogram: torch.Tensor, lo: float, hi: float, dst_nbins: int, start_bin: int, end_bin: int
) -> float:
    """The L2 error of quantizing ``histogram`` (on [lo, hi]) to ``dst_nbins`` levels spread
    over bins ``start_bin..end_bin``, every term in float64: each source bin's mass is taken
    as uniform over the bin, and the squared distance to the centre of the destination bin(s)
    it falls in is integrated (the cube of a distance, hence float64 for values near 1e13).
    The same model of the error as torch's HistogramObserver."""
    bins = histogram.numel()
    width = (hi - lo) / bins
    step = width * (end_bin - start_bin + 1) / dst_nbins
    if step == 0.0:
        return 0.0
    density = histogram.detach().to(torch.float64) / width
    begin = (torch.arange(bins, dtype=torch.float64) - start_bin) * width  # from the first kept bin
    end = begin + width
    first = torch.clamp(torch.div(begin, step, rounding_mode="floor"), 0, dst_nbins - 1)
    last = torch.clamp(torch.div(end, step, rounding_mode="floor"), 0, dst_nbins - 1)

    def integral(a: torch.Tensor | float, b: torch.Tensor | float) -> torch.Tensor:
        return density * (b**3 - a**3) / 3

    half = step / 2
    total = integral(begin - (first + 0.5) * step, half)  # the part in the first destination bin
    total = total + (last - first - 1) * integral(-half, half)  # whole destination bins between
    total = total + integral(-half, end - (last * step + half))  # the part in the last one
    return float(total.sum())


# -- 6. HistogramObserver's private re-binning --------------------------------------------------


def rebin_histogram(
    observer: HistogramObserver,
    histogram: torch.Tensor,
    min_val: torch.Tensor,
    max_val: torch.Tensor,
    new_min: torch.Tensor,
    new_max: torch.Tensor,
) -> torch.Tensor:
    """``histogram`` over ``[min_val, max_val]`` mapped onto ``observer.bins`` bins over the
    wider ``[new_min, new_max]``, the way ``observer`` re-bins its own histogram when a batch
    widens its range (torch's ``_combine_histograms`` with an empty update: unchanged when the
    range is the same, all mass into one bin when ``min_val == max_val``, otherwise each bin
    split into ``upsample_rate`` parts assigned by their mid-points). Mass is preserved."""
    empty = torch.zeros(observer.bins, dtype=histogram.dtype, device=histogram.device)
    combined: torch.Tensor = observer._combine_histograms(histogram, min_val, max_val, empty, new_min, new_max)
    return combined


# -- 7. segment sums ---------------------------------------------------------------------------


def segment_sum(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``out[j] = values[offsets[j]] + ... + values[offsets[j + 1] - 1]`` for a 1-d float
    tensor and non-decreasing int64 ``offsets`` from 0 to ``len(values)``, each sum
    accumulated in ``values``' dtype from 0 in index order (an empty run is 0) -- the same
    additions, in the same order, as ``torch.bincount(index, weights=values)`` makes when
    ``index`` is ``j`` on run ``j``, so the same bits.

    ``torch.segment_reduce``'s CPU kernel sums each run sequentially from 0; without it
    (a torch that removed it, or another device) the ``bincount`` itself."""
    reduce = getattr(torch, "segment_reduce", None)
    if reduce is not None and values.is_cpu:
        result: torch.Tensor = reduce(values, "sum", offsets=offsets)
        return result
    runs = torch.repeat_interleave(
        torch.arange(len(offsets) - 1, device=offsets.device), offsets.diff()
    )  # pragma: no cover - torch without segment_reduce
    return torch.bincount(runs, weights=values, minlength=len(offsets) - 1)  # pragma: no cover


def pt2_packager() -> Any:
    """``torch.export.pt2_archive._package`` when it has the two names
    ``_modules/archive_stream`` replaces (``_get_raw_tensor_bytes``, a function of a tensor
    returning its storage's bytes, and ``PT2ArchiveWriter.write_bytes``), else None."""
    try:
        from torch.export.pt2_archive import _package
    except ImportError:  # pragma: no cover - another torch
        return None
    writer = getattr(_package, "PT2ArchiveWriter", None)
    if not callable(getattr(_package, "_get_raw_tensor_bytes", None)) or not callable(
        getattr(writer, "write_bytes", None)
    ):
        return None  # pragma: no cover - another torch
    return _package

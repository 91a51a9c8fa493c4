"""torch's fake-tensor dispatch cache opened to the quant ops (``quantized_decomposed``), for the test session
(issue #23; switched on by :func:`tests.executorch_speedups.lowering_speedups`; ``QUANTWEAVE_FAKE_CACHE_QUANT=0``
turns it off).

Every ExecuTorch pass re-runs its graph on fake tensors (``executorch.exir.pass_base.ExportPass``: XNNPACK runs
~20 passes per delegate), and so does every ``torch.export``. torch's ``FakeTensorMode`` caches an op's output
metadata under its inputs' metadata and arguments, but only for ops of the ``aten`` / ``prim`` / ``prims``
namespaces: ``_validate_cache_key`` turns every other op away ("non-builtin"), since a custom op's fake kernel
is not known to depend on nothing else. In a quantized lowering the quantize / dequantize / choose_qparams ops
of ``quantized_decomposed`` are about half of all fake dispatches (the zoo's llama through xnnpack: 6127
turned away, 4547 cache hits), each one running its fake kernel again.

Those kernels depend only on their inputs' metadata and their scalar arguments: a tensor of the input's shape
in the target dtype, or scales / zero points of a shape the arguments fix. So only the "non-builtin" verdict
is lifted, and only for ops of :data:`NAMESPACES`; every other check torch makes still turns an op away (the
``data_dependent_output`` / ``dynamic_output_shape`` tags, in-place views, lifts, and, when the entry is made,
unbacked symbols and outputs aliasing inputs). torch 2.13 makes the "non-builtin" check last but one, so the
last one (views with a CompositeImplicitAutograd kernel) is repeated here. Entering and leaving the block
empty the cache: torch also caches an op being turned away, and nothing admitted may outlive the block.

Measured (zoo llama through xnnpack, one thread, the session's other shortcuts on, separate processes
alternated, load 1.0-1.8): 12.4-14.3 s CPU per lowering against 14.5-16.6 s without; .pte bytes identical
(also swin, 15.5-15.7 against 18.0-19.8 s). ``python -m tests._lowering_check`` compares .pte bytes and CPU
with and without all of the newer shortcuts.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import torch

ENV = "QUANTWEAVE_FAKE_CACHE_QUANT"
#: the op namespaces whose fake dispatches may be cached
NAMESPACES = frozenset({"quantized_decomposed"})
#: the key under which :func:`installed` counts the cache entries it let torch make
ADMITTED = "fake cache entries of quant ops"


def _admitting(original: Any, stats: collections.Counter) -> Any:
    from torch._subclasses.fake_tensor import _BypassDispatchCache

    def validate(self: Any, func: Any, args: Any, kwargs: Any) -> None:
        try:
            original(self, func, args, kwargs)
        except _BypassDispatchCache as bypass:
            if bypass.reason != "non-builtin" or getattr(func, "namespace", None) not in NAMESPACES:
                raise
            # torch's last check, after the one lifted
            if func.is_view and torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), torch._C.DispatchKey.CompositeImplicitAutograd
            ):
                raise _BypassDispatchCache("CompositeImplicitAutograd") from None
            stats[ADMITTED] += 1

    validate.__wrapped__ = original  # type: ignore[attr-defined]
    return validate


@contextlib.contextmanager
def installed(stats: collections.Counter | None = None) -> Iterator[collections.Counter]:
    """Fake dispatches of the ops of :data:`NAMESPACES` cached for the block (counted in ``stats`` under
    :data:`ADMITTED`), from an empty cache; torch's check and an empty cache again after it. Yields the
    counts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    stats = collections.Counter() if stats is None else stats
    original = FakeTensorMode.__dict__["_validate_cache_key"]
    FakeTensorMode.cache.clear()  # torch keeps "turned away" entries too: a quant op's would stay turned away
    FakeTensorMode._validate_cache_key = _admitting(original, stats)  # type: ignore[method-assign]
    try:
        yield stats
    finally:
        FakeTensorMode._validate_cache_key = original  # type: ignore[method-assign]
        FakeTensorMode.cache.clear()  # entries of quant ops would be served without the check

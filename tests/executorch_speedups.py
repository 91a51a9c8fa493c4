"""torch's list of preservable CompositeImplicitAutograd ops computed once per operator registry
state, for the test session (every env; what it saves is in ExecuTorch lowerings).

``ExportedProgram.run_decompositions`` calls ``torch._export.utils._collect_all_valid_cia_ops``
(via ``_split_decomp_table_to_cia_and_python_decomp`` and the decomposition table's
``materialize``): it walks every op of every ``torch.ops`` namespace (about 195 in a test
session, where tests register their own libraries) and asks the dispatcher about each overload.
An ExecuTorch lowering (``to_edge_transform_and_lower``) decomposes 5 times: a
cProfile put this walk at ~1.1 s of a 1.8 s lowering of a 2-op model. torch does not cache it
because a ``torch.library`` registration can change the answer; its answer depends only on the
operator registry, so this memoizes it on a fingerprint of that registry, taken at every call
(about 7 ms, :func:`registry_fingerprint`):

- the set of ops with a C++ ``CompositeImplicitAutograd`` kernel (a registered or removed CIA
  kernel, a library torn down, changes it),
- the number of operators the dispatcher knows (a newly defined op),
- the ``torch.ops`` namespaces and the op packets materialized in each (an op first reached
  from Python: the walk only sees materialized packets).

What it cannot see without the walk itself: a Python-only CIA kernel (``op.py_impl(
DispatchKey.CompositeImplicitAutograd)``) added to an already materialized op that has no C++
CIA kernel; torch's export adds such kernels only inside its own decomposition contexts, after
the list is taken. ``QUANTWEAVE_CHECK_CIA_MEMO=1`` computes the original as well on every call
and fails on any difference (how the memo was checked on the executorch, xnnpack and zoo envs).

Each caller gets its own copy of the set (torch's callers only read it; a copy keeps it so).

Also here: :func:`node_sources_shared`, torch's provenance records shared instead of deep-copied
by every pass (~11 % of a lowering), and :func:`lowering_speedups`, the newer shortcuts under one
switch: GraphModule code generation deferred inside ExecuTorch's lowering entry points
(tests/_lowering_lazy.py, off with ``QUANTWEAVE_LAZY_RECOMPILE=0``), torch's fake-tensor dispatch cache
opened to the quant ops (tests/_fake_cache.py, off with ``QUANTWEAVE_FAKE_CACHE_QUANT=0``) and, with
``QUANTWEAVE_LOWERING_REPEATS=PATH``, a count of lowerings that repeat an earlier one
(tests/_lowering_memo.py; counts only). ``python -m tests._lowering_check`` compares .pte bytes and
CPU with and without them.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from collections.abc import Callable, Hashable, Iterator
from types import ModuleType

import pytest
import torch

NAME = "_collect_all_valid_cia_ops"
CHECK = "QUANTWEAVE_CHECK_CIA_MEMO"


def modules_binding(name: str, original: object) -> list[ModuleType]:
    """Every imported module whose own namespace binds ``name`` to ``original`` (where a patch of
    ``original`` has to go: ``from x import f`` copies the binding). A module-level ``__getattr__``
    (a deprecated alias) is not asked."""
    return [module for module in list(sys.modules.values()) if getattr(module, "__dict__", {}).get(name) is original]


def registry_fingerprint() -> Hashable:
    """A cheap key that changes whenever the preservable CIA ops can (see the module docstring)."""
    cia = frozenset(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))
    namespaces = tuple(
        (name, len(namespace._dir))
        for name in list(torch.ops._dir)
        if isinstance(namespace := getattr(torch.ops, name), torch._ops._OpNamespace)
    )
    return (cia, len(torch._C._dispatch_get_all_op_names()), namespaces)


def memoized(original: Callable[[], set], stats: dict, check: bool = False) -> Callable[[], set]:
    """``original`` (``_collect_all_valid_cia_ops``) remembered for the last registry fingerprint;
    ``stats`` counts "computed" and "reused"; ``check``: compute the original on every call too and
    raise AssertionError naming the ops that differ."""
    last: list = [None, None]  # fingerprint, result

    def collect() -> set:
        key = registry_fingerprint()
        if last[1] is None or last[0] != key:
            stats["computed"] += 1
            # the walk materializes packets (changing the fingerprint): key the result on the state after it
            last[1] = frozenset(original())
            last[0] = registry_fingerprint()
        else:
            stats["reused"] += 1
            if check:
                fresh = original()
                if fresh != last[1]:
                    raise AssertionError(
                        f"{CHECK}: memoized {NAME} differs from torch's: missing "
                        f"{sorted(map(str, fresh - last[1]))[:10]}, extra {sorted(map(str, last[1] - fresh))[:10]}"
                    )
        return set(last[1])

    collect.__wrapped__ = original  # type: ignore[attr-defined]
    return collect


def cia_ops_collected_once() -> Iterator[dict]:
    """For a session-scoped autouse fixture (tests/conftest.py): patches ``_collect_all_valid_cia_ops``
    for the session in ``torch._export.utils`` and in every imported module that bound it by name
    (``torch.export.exported_program``, ``torch.export.decomp_utils``); yields the counts."""
    from torch._export import utils

    stats = {"computed": 0, "reused": 0}
    original = getattr(utils, NAME)
    collect = memoized(original, stats, check=os.environ.get(CHECK) == "1")
    patch = pytest.MonkeyPatch()
    for module in modules_binding(NAME, original):
        patch.setattr(module, NAME, collect)
    try:
        yield stats
    finally:
        patch.undo()


# -- provenance records shared, not deep-copied ---------------------------------------------------------

#: what :func:`node_sources_shared` gives ``torch.fx.traceback.NodeSource``
DEEPCOPY = "__deepcopy__"


def _same_node_source(self: object, memo: dict) -> object:
    return self


def node_sources_shared() -> Iterator[None]:
    """For a session-scoped autouse fixture (tests/conftest.py): ``copy.deepcopy`` of a
    ``torch.fx.traceback.NodeSource`` (a node's provenance record, ``node.meta["from_node"]``)
    returns the record itself for the session.

    Every node a pass re-creates gets a ``NodeSource`` whose ``__init__`` deep-copies the whole
    chain of records of the node it came from (``copy.deepcopy(node.meta["from_node"])``), and the
    chain grows by one record per pass: an ExecuTorch lowering runs ~20 XNNPACK passes per delegate
    plus the edge passes, so the copies grow with (passes x nodes x depth); py-spy put
    ``NodeSource.__init__`` at ~11 % of a zoo lowering (swin, llama through xnnpack). A record is
    never changed after it is made (torch and ExecuTorch build new ones and new lists: the lists
    in ``node.meta`` are still copied, only the records in them are shared), so sharing gives every
    node the same provenance, record for record (``to_dict()`` equal), and the same .pte bytes
    (tests/executorch_plugin/test_speedups.py)."""
    from torch.fx.traceback import NodeSource

    if DEEPCOPY in vars(NodeSource):  # torch gave it one of its own: leave it alone
        yield
        return
    setattr(NodeSource, DEEPCOPY, _same_node_source)
    try:
        yield
    finally:
        delattr(NodeSource, DEEPCOPY)


# -- the newer shortcuts, one switch ---------------------------------------------------------------


@contextlib.contextmanager
def lowering_speedups() -> Iterator[dict]:
    """Every newer lowering shortcut on for the block (each one off with its environment variable set to
    0); yields their counts."""
    from tests import _fake_cache, _lowering_lazy, _lowering_memo

    with contextlib.ExitStack() as stack:
        if os.environ.get(_lowering_memo.ENV):  # first: the windows below wrap the counted function
            stack.enter_context(_lowering_memo.counting(os.environ[_lowering_memo.ENV]))
        stats: collections.Counter = collections.Counter()
        if os.environ.get(_lowering_lazy.ENV) != "0":
            stats = stack.enter_context(_lowering_lazy.installed())
        if os.environ.get(_fake_cache.ENV) != "0":
            stack.enter_context(_fake_cache.installed(stats))
        yield stats

"""One measurement per (model, plugin): ours and the peer's, in the same run.

- ``x86``: quantweave-x86's ``X86InductorQuantizer`` (static), converted, then
  ``quantweave_x86.lower`` (inductor) and run; peer: torchao 0.18's ``X86InductorQuantizer``
  with its default static config (same ``reduce_range``), torchao's prepare / convert;
- ``xnnpack``: quantweave-xnnpack's ``XNNPACKQuantizer`` (static, per-channel weights),
  converted, lowered by ``quantweave_xnnpack.to_executorch`` and run on the ExecuTorch
  runtime; peer: ExecuTorch 1.5.1's ``XNNPACKQuantizer`` with the same config;
- ``llm`` (language and speech models): quantweave-executorch's ``ExecuTorchQuantizer("llm")``
  lowered by ``quantweave_executorch.to_executorch`` and run; peer: ExecuTorch's own LLM
  composition (``embedding,xnnpack_dynamic``: torchao's ``EmbeddingQuantizer`` + ExecuTorch's
  dynamic ``XNNPACKQuantizer``).

Coverage counts weighted ops: conv / linear / addmm / mm / matmul / bmm with a constant
operand, and embeddings (their table), in the converted graph; an op is quantized when its
weight (table) reaches it through a dequantize. SQNR (dB) is against the float model's
output on the example inputs: ``sqnr`` of the converted (reference q/dq) model, for ours and
the peer's alike, and ``runtime_sqnr`` of our lowered program's output. A peer that raises
is recorded with its error (``peer_error``), as is a program of ours that does not lower,
load or run (``error``). With ``QUANTWEAVE_ZOO_LOG=PATH`` each measurement is appended to PATH
as a line of JSON (with the seconds it took): ``python -m tests.zoo.table --from PATH ...``
renders the table of one or several runs (e.g. the zoo's tests split over processes).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.testing.inspect import sqnr

from .models import BUILDERS, ZooModel

PLUGINS = ("x86", "xnnpack", "llm")
aten = torch.ops.aten

#: weighted op -> position of its weight (None: whichever operand is a constant)
WEIGHTED: dict[Any, int | None] = {
    aten.conv1d.default: 1,
    aten.conv2d.default: 1,
    aten.conv3d.default: 1,
    aten.conv1d.padding: 1,
    aten.conv2d.padding: 1,
    aten.conv3d.padding: 1,
    aten.conv_transpose1d.default: 1,
    aten.conv_transpose2d.input: 1,
    aten.linear.default: 1,
    aten.addmm.default: 2,
    aten.mm.default: None,
    aten.matmul.default: None,
    aten.bmm.default: None,
    aten.embedding.default: 0,
}
#: ops a constant passes through on its way to the weighted op
_PASS_THROUGH = {"view", "reshape", "t", "transpose", "permute", "expand", "_to_copy", "contiguous", "clone"}


def _is_dequantize(node: Node) -> bool:
    return "dequantize" in str(node.target)


def _constant_path(arg: Any) -> tuple[bool, bool]:
    """(does ``arg`` come from a constant, through a dequantize?)"""
    dequantized = False
    while isinstance(arg, Node):
        if arg.op == "get_attr":
            return True, dequantized
        if arg.op != "call_function" or not arg.args:
            return False, False
        name = getattr(arg.target, "__name__", str(arg.target)).split(".")[0]
        if _is_dequantize(arg):
            dequantized = True
        elif name not in _PASS_THROUGH:
            return False, False
        arg = arg.args[0]
    return False, False


def coverage(gm: GraphModule) -> tuple[int, int]:
    """(weighted ops whose weight is quantized, weighted ops) in ``gm``."""
    quantized = total = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in WEIGHTED:
            continue
        index = WEIGHTED[node.target]
        positions = [index] if index is not None else [0, 1]
        paths = [_constant_path(node.args[i]) for i in positions if i < len(node.args)]
        constant = [deq for is_constant, deq in paths if is_constant]
        if constant:
            total += 1
            quantized += any(constant)
    return quantized, total


@dataclass(frozen=True)
class Measurement:
    model: str
    plugin: str
    quantized: int = 0
    weighted: int = 0
    sqnr: float | None = None
    runtime_sqnr: float | None = None
    loads: bool = False
    error: str | None = None  #: ours: what raised (None: lowered, loaded and ran)
    peer_quantized: int | None = None
    peer_weighted: int | None = None
    peer_sqnr: float | None = None
    peer_error: str | None = None

    @property
    def coverage(self) -> str:
        return f"{self.quantized}/{self.weighted}"

    @property
    def peer_coverage(self) -> str | None:
        return None if self.peer_quantized is None else f"{self.peer_quantized}/{self.peer_weighted}"


@functools.cache
def zoo_model(name: str) -> ZooModel:
    torch.manual_seed(0)
    return BUILDERS[name]()


#: the models the "llm" preset applies to (language and speech)
LLM_MODELS = ("bert", "gpt2", "llama", "qwen2", "distilbert", "whisper_encoder")
#: (model, plugin) measured
CASES = [(m, p) for m in BUILDERS for p in PLUGINS if p != "llm" or m in LLM_MODELS]


@functools.cache
def exported(name: str) -> GraphModule:
    """``name``'s float model, exported once a run (``torch.export.export(...).module()``) and
    shared by every plugin's flow: ours is given it as it is (and must leave it unchanged:
    :func:`measure` checks), the peer a deep copy (torchao's ``prepare_pt2e`` annotates the
    graph it is given)."""
    zoo = zoo_model(name)
    return torch.export.export(zoo.model, zoo.inputs).module()


@functools.cache
def reference(name: str) -> torch.Tensor:
    """The float model's output on its example inputs (computed once a run)."""
    zoo = zoo_model(name)
    with torch.no_grad():
        return zoo.model(*zoo.inputs)


def fingerprint(gm: GraphModule) -> tuple[str, tuple[tuple[str, ...], ...], dict[str, torch.Tensor]]:
    """What a flow must not change in the model it is given: the graph's code, each node's
    meta keys, and copies of the parameters and buffers."""
    meta = tuple((n.name, *sorted(n.meta)) for n in gm.graph.nodes)
    return gm.code, meta, {k: v.detach().clone() for k, v in gm.state_dict().items()}


def changes(before: tuple[Any, ...], gm: GraphModule) -> list[str]:
    """What differs between ``before`` (a :func:`fingerprint`) and ``gm`` now."""
    code, meta, tensors = fingerprint(gm)
    found = [] if code == before[0] else ["the graph's code"]
    found += [] if meta == before[1] else ["node meta"]
    if tensors.keys() != before[2].keys():
        found.append("the parameters / buffers held")
    else:
        found += [k for k, v in tensors.items() if not torch.equal(v, before[2][k])]
    return found


def _flow(
    zoo: ZooModel, model: GraphModule, quantizer: Any, prepare: Callable[..., Any], convert: Callable[..., Any]
) -> GraphModule:
    prepared = prepare(model, quantizer)
    with torch.no_grad():
        for batch in zoo.calibration:
            prepared(*batch)
    return convert(prepared)


def _short(error: BaseException) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first[:160]}"


def _quantizers(plugin: str) -> tuple[Any, Callable[[], Any]]:
    """(our quantizer, a factory of the peer's)"""
    if plugin == "x86":
        import quantweave_x86 as q86

        reduce_range = q86.cpu_needs_reduce_range()

        def peer() -> Any:
            from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

            config = xiq.get_default_x86_inductor_quantization_config(reduce_range=reduce_range)
            return xiq.X86InductorQuantizer().set_global(config)

        return q86.X86InductorQuantizer(reduce_range=reduce_range), peer
    if plugin == "xnnpack":
        import quantweave_xnnpack as qx

        def peer() -> Any:
            from executorch.backends.xnnpack.quantizer import xnnpack_quantizer as xq

            return xq.XNNPACKQuantizer().set_global(xq.get_symmetric_quantization_config(is_per_channel=True))

        return qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(is_per_channel=True)), peer
    from quantweave_executorch import ExecuTorchQuantizer

    def peer() -> Any:
        from executorch.extension.llm.export import quantizer_lib as lib
        from torchao.quantization.pt2e.quantizer import ComposableQuantizer

        options = lib.get_pt2e_quantization_params("embedding,xnnpack_dynamic", None)
        return ComposableQuantizer(lib.get_pt2e_quantizers(options))

    return ExecuTorchQuantizer("llm"), peer


def _lower(plugin: str, converted: GraphModule, inputs: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
    """Lower ``converted`` for ``plugin``'s runtime and load it: a callable returning one tensor."""
    if plugin == "x86":
        import quantweave_x86 as q86

        lowered = q86.lower(converted, inputs)
        return lambda *args: lowered(*args)
    if plugin == "xnnpack":
        import quantweave_xnnpack as qx

        runner = qx.to_executorch(converted, inputs).load()
    else:
        import quantweave_executorch as qe

        runner = qe.to_executorch(converted, inputs).load()
    return lambda *args: runner(*args)[0]


@functools.cache
def measure(name: str, plugin: str) -> Measurement:
    """Ours and the peer's numbers for ``name`` through ``plugin`` (cached: computed once a run)."""
    from torchao.quantization.pt2e import quantize_pt2e as ao

    start = time.perf_counter()
    zoo = zoo_model(name)
    reference_output = reference(name)
    shared = exported(name)
    before = fingerprint(shared)
    peer_model = copy.deepcopy(shared)  # taken first: a change by ours would not reach the peer's flow
    ours, peer = _quantizers(plugin)
    result: dict[str, Any] = {}
    try:
        converted = _flow(zoo, shared, ours, qw.prepare_pt2e, qw.convert_pt2e)
        result["quantized"], result["weighted"] = coverage(converted)
        with torch.no_grad():
            result["sqnr"] = sqnr(reference_output, converted(*zoo.inputs))
        run = _lower(plugin, converted, zoo.inputs)
        result["runtime_sqnr"] = sqnr(reference_output, run(*zoo.inputs))
        result["loads"] = True
        changed = changes(before, shared)
        if changed:
            raise AssertionError(f"the exported model given to prepare_pt2e was changed: {', '.join(changed)}")
    except Exception as error:  # recorded: the tests say what failed
        result["error"] = _short(error)
        result["traceback"] = traceback.format_exc()
    try:
        theirs = _flow(zoo, peer_model, peer(), ao.prepare_pt2e, ao.convert_pt2e)
        result["peer_quantized"], result["peer_weighted"] = coverage(theirs)
        with torch.no_grad():
            result["peer_sqnr"] = sqnr(reference_output, theirs(*zoo.inputs))
    except Exception as error:  # the peer failing is a finding, not a failure of ours
        result["peer_error"] = _short(error)
    result.pop("traceback", None)
    measurement = Measurement(name, plugin, **result)
    log = os.environ.get("QUANTWEAVE_ZOO_LOG")
    if log:
        with open(log, "a") as f:
            seconds = round(time.perf_counter() - start, 1)
            f.write(json.dumps({**dataclasses.asdict(measurement), "seconds": seconds}) + "\n")
    return measurement


def from_log(paths: list[str]) -> dict[tuple[str, str], Measurement]:
    """The measurements QUANTWEAVE_ZOO_LOG files recorded (the last one of a case wins)."""
    fields = {f.name for f in dataclasses.fields(Measurement)}
    out = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                record = {k: v for k, v in json.loads(line).items() if k in fields}
                out[(record["model"], record["plugin"])] = Measurement(**record)
    return out

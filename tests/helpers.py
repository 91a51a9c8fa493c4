"""Helpers shared by the test modules (fixtures stay in conftest.py; :func:`exported_once_fixtures`
makes a pair of fixtures a module binds to its own names).

A model, quantizer, input, constant or function two test modules use lives here (or, when it needs a
package not installed in every env -- ExecuTorch, torchao, transformers, onnx -- imported inside the
helper, or in a topical helper module beside this one: tests/xnnpack/_cases.py, tests/executorch_speedups.py),
never in a test module another imports (tests/test_import_graph.py checks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx import GraphModule, Node

import quantweave as qw
from quantweave.authoring import annotate_input_qspec_map, annotate_output_qspec
from quantweave.observers import (
    FakeQuantize,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
)
from quantweave.plugin_api import ANNOTATION_KEY, SKIP_REASON_KEY, is_annotated

aten = torch.ops.aten


def export(model: torch.nn.Module, *args: torch.Tensor) -> torch.fx.GraphModule:
    """Default (non-strict) torch.export, as users call it."""
    return torch.export.export(model.eval(), args).module()


class ConvLinear(torch.nn.Module):
    """Conv2d (3 -> 8, 3x3) -> relu -> Linear (6 -> 4) on a 1x3x8x8 image."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.linear = torch.nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.conv(x).relu())


def xnnpack_static_conv_linear() -> tuple[torch.nn.Module, GraphModule, torch.Tensor]:
    """(float :class:`ConvLinear` in eval mode, its quantweave-xnnpack static-quantized conversion
    calibrated on one input, that input): a small program for lowering tests (needs quantweave-xnnpack)."""
    import quantweave as qw
    import quantweave.authoring as qa
    import quantweave_xnnpack as qx

    x = torch.randn(1, 3, 8, 8)
    model = ConvLinear().eval()
    quantizer = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config())
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    prepared(x)
    converted = qw.convert_pt2e(prepared)
    qdq = set(qa.quantize_ops()) | set(qa.dequantize_ops())
    assert sum(n.target in qdq for n in converted.graph.nodes) >= 6, converted.graph  # the conv's and linear's
    return model, converted, x


def spec_key(spec):
    """A comparable key for a PT2E spec of quantweave's or a peer's (torchao / ExecuTorch):
    ("shared", producer name(s)) for a shared spec, else its fields and observer class name."""
    if spec is None:
        return None
    if type(spec).__name__ == "SharedQuantizationSpec":
        target = spec.edge_or_node
        return ("shared", tuple(n.name for n in target) if isinstance(target, tuple) else target.name)
    ctr = spec.observer_or_fake_quant_ctr
    observer = getattr(getattr(ctr, "p", None), "func", ctr).__name__
    return (spec.dtype, spec.quant_min, spec.quant_max, spec.qscheme, spec.ch_axis, spec.is_dynamic, observer)


class Snapshot:
    """What a module looks like: generated code, its meta, node names and meta, attributes,
    state (``differences`` lists what changed since)."""

    def __init__(self, gm: GraphModule) -> None:
        self.code = gm.code
        self.meta = dict(gm.meta)
        self.nodes = [(n.name, dict(n.meta)) for n in gm.graph.nodes]
        self.attrs = sorted(name for name, _ in gm.named_modules()) + sorted(gm.state_dict())
        self.state = {k: v.detach().clone() for k, v in gm.state_dict().items()}

    @classmethod
    def of(cls, gm: GraphModule) -> Snapshot:
        return cls(gm)

    def differences(self, gm: GraphModule) -> list[str]:
        now = Snapshot(gm)
        out = [what for what in ("code", "meta", "nodes", "attrs") if getattr(now, what) != getattr(self, what)]
        out += [f"state {k!r}" for k, v in self.state.items() if not torch.equal(now.state.get(k, v + 1), v)]
        return out


def exported_once_fixtures(
    name: str,
    make_model: Callable[[], torch.nn.Module],
    make_args: Callable[[], tuple[Any, ...]],
    seed: int | None = None,
) -> tuple[Any, Any]:
    """(module-scoped fixture, fixture ``name``) for a test module whose tests each exported the
    same model: ``make_model()`` (after ``torch.manual_seed(seed)`` when given) exported with
    ``make_args()`` once per module, handed to each test as ``name`` and checked unchanged
    before and after it (a test that modifies it fails there). ``make_model()`` runs again
    before each test, so the global RNG is left as each test's own export left it (the model is
    cheap, the export is not). Bind both in the module: ``_once, caller =
    exported_once_fixtures("caller", ...)``."""
    once_name = f"_{name}_exported_once"

    @pytest.fixture(scope="module", name=once_name)
    def once() -> tuple[GraphModule, Snapshot]:
        if seed is not None:
            torch.manual_seed(seed)
        model = make_model()
        gm = torch.export.export(model, make_args()).module()
        return gm, Snapshot.of(gm)

    @pytest.fixture(name=name)
    def each(request: pytest.FixtureRequest) -> Any:
        gm, snapshot = request.getfixturevalue(once_name)
        make_model()
        assert not snapshot.differences(gm), snapshot.differences(gm)
        yield gm
        assert not snapshot.differences(gm), f"the test modified the exported model: {snapshot.differences(gm)}"

    return once, each


def count_code_generations(monkeypatch: pytest.MonkeyPatch) -> list[torch.fx.Graph]:
    """From now on, each ``torch.fx.Graph.python_code`` call (a GraphModule generating its
    Python code) appends its graph to the returned list (undone by ``monkeypatch``)."""
    calls: list[torch.fx.Graph] = []
    python_code = torch.fx.Graph.python_code

    def counting(self: torch.fx.Graph, *args: Any, **kwargs: Any) -> Any:
        calls.append(self)
        return python_code(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", counting)
    return calls


def _messages(caught) -> list[str]:
    """The message(s) of what a test caught: pytest's ExceptionInfo (``pytest.raises(...) as info``),
    a warnings record (``pytest.warns(...) as record``, a list of them), an exception or a string."""
    if isinstance(caught, str):
        return [caught]
    if isinstance(caught, BaseException):
        return [str(caught)]
    if hasattr(caught, "value") and isinstance(caught.value, BaseException):  # ExceptionInfo
        return [str(caught.value)]
    if hasattr(caught, "message"):  # one warnings.WarningMessage
        return [str(caught.message)]
    return [message for item in caught for message in _messages(item)]  # a record of warnings


def assert_names(caught, *names: object) -> None:
    """The message names each of ``names`` (the node, option, field, value, fix at fault), whatever
    its wording: the test pins what a message says, not how. For a record of warnings, one warning
    must name them all."""
    messages = _messages(caught)
    wanted = [str(name) for name in names]
    if any(all(name in message for name in wanted) for message in messages):
        return
    closest = max(messages, key=lambda m: sum(name in m for name in wanted), default="")
    missing = [name for name in wanted if name not in closest]
    raise AssertionError(f"the message does not name {missing}: {closest!r}" if messages else "nothing was caught")


# -- the caller's model and inputs, checked unchanged (the bad-input corpus: tests/core/test_bad_*.py and
# tests/integration/test_bad_*_plugins.py)


def clone_inputs(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(x.clone() for x in inputs)


def inputs_unchanged(before: tuple[torch.Tensor, ...], after: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


class SplitConvLinear(torch.nn.Module):
    """Conv2d (3 -> 4, 3x3) -> relu -> split into 2 + 2 channels, concatenated swapped -> mean over
    the image -> Linear (4 -> 2), on Nx3xHxW images."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        a, b = torch.split(y, [2, 2], 1)
        return self.linear(torch.cat([b, a], 1).mean((2, 3)))


class Caller:
    """The caller's exported model (default :class:`SplitConvLinear` on one 2x3x8x8 input) and inputs,
    snapshotted, to check nothing was lost (``assert_untouched``)."""

    def __init__(self, model: torch.nn.Module | None = None, *inputs: torch.Tensor, **kwargs: Any):
        model = SplitConvLinear() if model is None else model
        self.inputs = inputs or (torch.randn(2, 3, 8, 8),)
        self.gm = torch.export.export(model.eval(), self.inputs, **kwargs).module()
        self.snapshot = Snapshot.of(self.gm)
        self.copies = clone_inputs(self.inputs)

    def assert_untouched(self) -> None:
        assert self.snapshot.differences(self.gm) == []
        assert all(ANNOTATION_KEY not in n.meta for n in self.gm.graph.nodes)
        assert inputs_unchanged(self.copies, self.inputs)


class ConvLinearSum(torch.nn.Module):
    """Conv2d (3 -> 4, 3x3) -> relu -> mean over the image -> Linear (4 -> 6) -> sum."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.linear = torch.nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.relu(self.conv(x)).mean((2, 3))).sum()


CONV_LINEAR_SUM_INPUT = torch.randn(2, 3, 8, 8)


class ConvLinearSumCaller:
    """:class:`ConvLinearSum` exported on :data:`CONV_LINEAR_SUM_INPUT` (in eval mode, or train mode with
    ``train=True``) and its snapshot: ``untouched()`` is True when nothing changed."""

    def __init__(self, train: bool = False) -> None:
        model = ConvLinearSum().train() if train else ConvLinearSum().eval()
        self.gm = torch.export.export(model, (CONV_LINEAR_SUM_INPUT,)).module()
        self.snapshot = Snapshot.of(self.gm)

    def untouched(self) -> bool:
        return self.snapshot.differences(self.gm) == []


class FnQuantizer(qw.Quantizer):
    """A quantizer named "corpus" whose ``annotate`` calls ``fn(model)``."""

    name = "corpus"

    def __init__(self, fn: Callable[[GraphModule], None]) -> None:
        self.fn = fn

    def annotate(self, model: GraphModule) -> GraphModule:
        self.fn(model)
        return model


def node_of(gm: GraphModule, target: Any) -> Node:
    """The first node of ``gm`` calling ``target``."""
    return next(n for n in gm.graph.nodes if n.target == target)


def annotate_on(target: Any, where: int | str, spec: Any) -> Callable[[GraphModule], None]:
    """Annotate input ``where`` (an argument index) or the output ("out") of the node of ``target``."""

    def fn(gm: GraphModule) -> None:
        node = node_of(gm, target)
        if where == "out":
            annotate_output_qspec(node, spec)
        else:
            annotate_input_qspec_map(node, node.args[where], spec)

    return fn


class ConvRelu(torch.nn.Module):
    """Conv2d (3 -> 4, 3x3) -> relu."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


CONV_RELU_INPUT = torch.randn(2, 3, 8, 8)


def exported_conv_relu() -> torch.fx.GraphModule:
    """:class:`ConvRelu` (eval mode) exported on :data:`CONV_RELU_INPUT`."""
    return torch.export.export(ConvRelu().eval(), (CONV_RELU_INPUT,)).module()


# -- the annotation report (tests/core/test_report.py, tests/integration/test_report_plugins.py); its
# activation and weight specs also serve tests/core/test_vocabulary_exports.py and test_conformance_kit.py

WEIGHTED_ACT = qw.QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=MinMaxObserver)
WEIGHTED_WEIGHT = qw.QuantizationSpec(
    dtype=torch.int8,
    qscheme=torch.per_channel_symmetric,
    ch_axis=0,
    observer_or_fake_quant_ctr=PerChannelMinMaxObserver,
)


class Weighted(qw.Quantizer):
    """Quantizes each ``target`` node's input, weight (:data:`WEIGHTED_ACT`, :data:`WEIGHTED_WEIGHT`) and
    output, except those under module ``skip_module`` (skipped with a reason the report reads)."""

    def __init__(self, name, target, skip_module=None):
        self.name, self.target, self.skip_module = name, target, skip_module

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.target != self.target or is_annotated(node):
                continue
            stack = node.meta.get("nn_module_stack", {})
            if self.skip_module and any(path == self.skip_module for path, _ in stack.values()):
                node.meta[SKIP_REASON_KEY] = f"module name {self.skip_module!r} configured None"
                continue
            annotate_input_qspec_map(node, node.args[0], WEIGHTED_ACT)
            annotate_input_qspec_map(node, node.args[1], WEIGHTED_WEIGHT)
            annotate_output_qspec(node, WEIGHTED_ACT)
            node.meta["quantization_annotation"]._annotated = True
        return model


class ConvMeanMlp(torch.nn.Module):
    """Conv2d (3 -> 4, 3x3) -> mean over the image -> fc1 (4 -> 4) -> fc2 (4 -> 2) -> sigmoid."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc1 = torch.nn.Linear(4, 4)
        self.fc2 = torch.nn.Linear(4, 2)

    def forward(self, x):
        y = self.conv(x).mean((2, 3))
        return torch.sigmoid(self.fc2(self.fc1(y)))


# -- the command line (tests/core/test_cli.py, tests/integration/test_cli_plugins.py)


def run_cli(capsys, pm, *argv):
    """(exit code, stdout) of ``quantweave ARGV...`` run in process with plugin manager ``pm``."""
    from quantweave.cli import main

    code = main(list(argv), manager=pm)
    return code, capsys.readouterr().out


# -- the drop-in for torchao's PT2E flow (tests/core/test_dropin.py, tests/peer/test_dropin_peer.py)


def calls(gm, *targets):
    """The call_function nodes of ``gm`` calling one of ``targets``."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]


class TwoLinears(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.a(x) + self.b(x)


class KVCache(torch.nn.Module):
    """A cache buffer read by a linear, then written in place at a position (so each call sees
    what the previous calls wrote)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 8))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, pos):
        out = self.proj(self.cache)
        self.cache.index_put_((pos,), x)
        return out


class IndexPutBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(4))

    def forward(self, x, idx):
        return self.buf.index_put_((idx,), x).clone()


class ConvBn(torch.nn.Module):
    """Conv2d (3 -> 4, 3x3) -> BatchNorm2d."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x))


class PaddedConvBn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3, padding="same"), torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def randomise_bn(bn):
    """Running mean in [-1, 1], running variance and weight in [0.5, 2] (in place)."""
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 2)


class ChunkedConvBn(torch.nn.Module):
    """One conv and batch norm applied to each chunk of the input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.cat([torch.relu(self.bn(self.conv(c))) for c in torch.chunk(x, 3, dim=1)], dim=1)


class ScanLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(5, 5)

    def forward(self, x, init):
        from torch._higher_order_ops.scan import scan

        def combine_fn(carry, x_slice):
            out = self.linear(x_slice)
            return carry + out, out

        return scan(combine_fn, init=init, xs=x, dim=0)[1]


class RefNet(torch.nn.Module):
    """conv -> max_pool -> add (+ relu) -> mean -> linear: every pattern written in integers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.linear = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4, 5)

    def forward(self, x, y):
        pooled = torch.nn.functional.max_pool2d(self.conv(x), 2)
        return self.linear(torch.relu(pooled + y).mean((2, 3)))


# -- QAT (tests/core/test_qat.py, tests/core/test_dropin.py, tests/peer/test_dropin_peer.py)

# averaging constant 1: qparams follow the latest batch, so a few training steps suffice here
QAT_ACT = qw.QuantizationSpec(
    dtype=torch.uint8,
    quant_min=0,
    quant_max=255,
    qscheme=torch.per_tensor_affine,
    observer_or_fake_quant_ctr=FakeQuantize.with_args(
        observer=MovingAverageMinMaxObserver.with_args(averaging_constant=1)
    ),
)
QAT_WEIGHT = qw.QuantizationSpec(
    dtype=torch.int8,
    quant_min=-127,
    quant_max=127,
    qscheme=torch.per_channel_symmetric,
    ch_axis=0,
    observer_or_fake_quant_ctr=FakeQuantize.with_args(
        observer=MovingAveragePerChannelMinMaxObserver.with_args(averaging_constant=1)
    ),
)


def _derived_bias_qparams(observers):
    act, weight = observers
    act_scale, _ = act.calculate_qparams()
    weight_scale, _ = weight.calculate_qparams()
    scale = (act_scale * weight_scale).float()
    return scale, torch.zeros_like(scale, dtype=torch.int32)


class ConvBnQATQuantizer(qw.Quantizer):
    """conv input and weight (:data:`QAT_ACT`, :data:`QAT_WEIGHT`; and, with ``quantize_bias``, a derived
    int32 bias) plus the output of the batch norm (or of the relu after it)."""

    def __init__(self, quantize_bias: bool = False) -> None:
        self.quantize_bias = quantize_bias

    def annotate(self, model):
        for conv in model.graph.nodes:
            if conv.target is not aten.conv2d.default:
                continue
            x, weight = conv.args[0], conv.args[1]
            input_map = {x: QAT_ACT, weight: QAT_WEIGHT}
            bias = conv.args[2] if len(conv.args) > 2 else None
            if self.quantize_bias and bias is not None:
                input_map[bias] = qw.DerivedQuantizationSpec(
                    derived_from=[(x, conv), (weight, conv)],
                    derive_qparams_fn=_derived_bias_qparams,
                    dtype=torch.int32,
                    quant_min=-(2**31),
                    quant_max=2**31 - 1,
                    qscheme=torch.per_channel_symmetric,
                    ch_axis=0,
                )
            conv.meta["quantization_annotation"] = qw.QuantizationAnnotation(input_qspec_map=input_map, _annotated=True)
            (bn,) = conv.users
            last = next(iter(bn.users)) if bn.users and next(iter(bn.users)).target is aten.relu.default else bn
            last.meta["quantization_annotation"] = qw.QuantizationAnnotation(output_qspec=QAT_ACT, _annotated=True)
        return model

    def validate(self, model):
        pass


# -- hosting quantizers written against another PT2E API (tests/core/test_hosting.py, tests/peer/test_hosting_peer.py)


def share_through_a_missing_edge(api):
    """A quantizer (written against ``api``) that annotates linear_1 with an entry for 'x',
    which is not its input, and shares linear_1's real input with that edge (Samsung's
    quantizer does this on reshapes)."""

    class Quantizer(api.Quantizer):
        def annotate(self, gm):
            first, second = [n for n in gm.graph.nodes if n.target == aten.linear.default]
            x = first.args[0]
            act = api.QuantizationSpec(
                dtype=torch.int8, observer_or_fake_quant_ctr=api.MinMaxObserver, qscheme=torch.per_tensor_affine
            )
            first.meta[ANNOTATION_KEY] = api.QuantizationAnnotation(input_qspec_map={x: act}, _annotated=True)
            second.meta[ANNOTATION_KEY] = api.QuantizationAnnotation(
                input_qspec_map={second.args[0]: api.SharedQuantizationSpec((x, second)), x: act}, _annotated=True
            )
            return gm

        def validate(self, gm):
            return None

    return Quantizer()


# -- ONNX Runtime (tests/onnxruntime/test_ort_*.py)


def ort_cnn():
    """(quantweave-onnxruntime's testing CNN with 16 channels in eval mode, 4 calibration batches, an input):
    8x3x64x64 images, seeded. Imports quantweave_onnxruntime when called (not installed in every env)."""
    from quantweave_onnxruntime.testing import CNN

    torch.manual_seed(0)
    model = CNN(channels=16).eval()
    batches = [torch.randn(8, 3, 64, 64) for _ in range(4)]
    return model, batches, torch.randn(8, 3, 64, 64)

"""Helpers shared by the test modules (fixtures stay in conftest.py; :func:`exported_once_fixtures`
makes a pair of fixtures a module binds to its own names)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx import GraphModule


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

"""Programs that load (issue #24): what ExecuTorch 1.5.1's XNNPACK partitioner takes and its
runtime refuses is kept out of the delegate by ``to_executorch`` (``_accept.REFUSALS``).

The case met on Swin: a zero constant pad reading a dequantized tensor, its output not
requantized (windows padded to a multiple of the window size, then reshaped into windows).
ExecuTorch's XNNPACK preprocessing quantizes the pad's output and not its input, and the
runtime refuses the node (``Failed to create StaticConstantPad node ... invalid_parameter``)
when the program is loaded. The check is tested on plain graphs (no ExecuTorch needed), the
lowering on the runtime (marked ``executorch``).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quantweave as qw
import quantweave_xnnpack as qx
from quantweave import authoring
from quantweave_xnnpack import _accept

PAD = "aten.constant_pad_nd.default"
aten = torch.ops.aten


class SwinStyleWindows(nn.Module):
    """A patch embedding (linear), the map padded to a multiple of the window (F.pad), window
    attention (qkv linear, softmax, two matmuls, proj), the windows merged back, cropped and
    added to the embedding: the padded windows of Swin at a small size."""

    def __init__(self, dim: int = 16, window: int = 4, heads: int = 2) -> None:
        super().__init__()
        self.window, self.heads = window, heads
        self.embed = nn.Linear(8, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, 8)
        b, h, w, _ = x.shape
        s = self.window
        e = self.embed(x)
        c = e.shape[-1]
        pb, pr = (s - h % s) % s, (s - w % s) % s
        p = F.pad(e, (0, 0, 0, pr, 0, pb))
        hp, wp = h + pb, w + pr
        t = p.view(b, hp // s, s, wp // s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, c)
        qkv = self.qkv(t).reshape(t.shape[0], s * s, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = ((qkv[0] @ qkv[1].transpose(-2, -1)) * (c // self.heads) ** -0.5).softmax(-1)
        o = self.proj((attn @ qkv[2]).transpose(1, 2).reshape(-1, s * s, c))
        o = o.view(b, hp // s, wp // s, s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
        return e + o[:, :h, :w, :]


class PadThenFloat(nn.Module):
    """A quantized linear's output padded, then read by a float op (exp): the pad must be kept out."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(self.linear(x), (0, 0, 0, 1)).exp()


class PadThenConv(nn.Module):
    """A conv's output padded and read by a conv: the pad's output is requantized (kept in)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(F.pad(self.c1(x), (0, 1, 0, 1)))


# --- the check, on plain graphs ---------------------------------------------------------------


def _pad_graph(*, quantized_input=True, requantized=False, value=0.0, amounts=(0, 0, 0, 1)):
    quantize, dequantize = authoring.quantize_ops()[0], authoring.dequantize_ops()[0]  # per tensor, scalar qparams
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    if quantized_input:
        x = graph.call_function(quantize, (x, 0.1, 0, -128, 127, torch.int8))
        x = graph.call_function(dequantize, (x, 0.1, 0, -128, 127, torch.int8))
    pad = graph.call_function(aten.constant_pad_nd.default, (x, list(amounts), value))
    user = (
        graph.call_function(quantize, (pad, 0.1, 0, -128, 127, torch.int8))
        if requantized
        else graph.call_function(aten.exp.default, (pad,))
    )
    graph.output(user)
    return pad


def test_the_check_refuses_a_zero_pad_of_a_dequantized_tensor_not_requantized():
    refusal = _accept.refusal_for(_pad_graph())
    assert refusal is not None
    assert refusal.target == "constant_pad_nd.default" and "StaticConstantPad" in refusal.reason


@pytest.mark.parametrize(
    "case",
    [
        {"quantized_input": False},  # a float pad: XNNPACK runs it in float
        {"requantized": True},  # output quantized: ExecuTorch leaves it alone
        {"value": 1.0},  # a non-zero pad value: ExecuTorch leaves it alone
        {"amounts": (0, 0, 0, -1)},  # a crop: the partitioner already refuses it
    ],
)
def test_the_check_leaves_every_other_pad_to_the_partitioner(case):
    assert _accept.refusal_for(_pad_graph(**case)) is None


def test_the_check_wraps_only_the_configs_it_has_refusals_for():
    class Config:
        target_name = "constant_pad_nd.default"

        def check_constraints(self, node, ep):
            return True

    class Other:
        target_name = "linear.default"

    guarded = _accept._guarded(Config, _accept.REFUSALS)
    assert guarded is not Config and guarded.__name__ == "Config" and issubclass(guarded, Config)
    assert _accept._guarded(Other, _accept.REFUSALS) is Other
    assert guarded().check_constraints(_pad_graph(), None) is False
    assert guarded().check_constraints(_pad_graph(requantized=True), None) is True


# --- on the ExecuTorch runtime ---------------------------------------------------------------


def _converted(model, inputs, quantizer=None, flow=qw):
    quantizer = quantizer or qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(is_per_channel=True))
    prepared = flow.prepare_pt2e(torch.export.export(model.eval(), inputs).module(), quantizer)
    torch.manual_seed(1)
    for _ in range(3):
        prepared(*[torch.randn_like(i) for i in inputs])
    return flow.convert_pt2e(prepared)


SWIN_INPUTS = (torch.randn(1, 6, 6, 8, generator=torch.Generator().manual_seed(0)),)


@pytest.fixture(scope="module")
def swin():
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e xnnpack)")
    torch.manual_seed(0)
    model = SwinStyleWindows().eval()
    converted = _converted(model, SWIN_INPUTS)
    return model, converted, qx.to_executorch(converted, SWIN_INPUTS)


@pytest.mark.executorch
def test_swin_style_padded_windows_load_and_run_on_the_runtime(swin):
    _, converted, program = swin
    assert program.not_delegated.get(PAD) == 1, program.summary()  # the refused pad, and nothing quantized
    assert not any("quantize" in op for op in program.not_delegated), program.summary()
    assert program.delegated.get("aten.linear.default") == 3, program.summary()
    (out,) = program.load()(*SWIN_INPUTS)
    ref = converted(*SWIN_INPUTS)
    assert out.shape == ref.shape
    step = next(n.args[1] for n in reversed(list(converted.graph.nodes)) if "dequantize_per_tensor" in str(n.target))
    assert (out - ref).abs().max().item() <= step * 1.001


@pytest.mark.executorch
def test_the_float_program_lowers_as_before(swin):
    """Float pads are not refused: the guarded partitioner delegates what ExecuTorch's own does."""
    exir = pytest.importorskip("executorch.exir")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    model = swin[0]
    ours = qx.to_executorch(model, SWIN_INPUTS)
    plain = exir.to_edge_transform_and_lower(
        torch.export.export(model, SWIN_INPUTS), partitioner=[XnnpackPartitioner()]
    ).to_executorch()
    assert ours.buffer == bytes(plain.buffer)
    assert ours.delegated.get(PAD) == 1
    (out,) = ours.load()(*SWIN_INPUTS)
    assert torch.allclose(out, model(*SWIN_INPUTS), atol=1e-5)


@pytest.mark.executorch
@pytest.mark.parametrize(
    ("model", "shape", "kept_out"), [(PadThenFloat, (1, 7, 8), True), (PadThenConv, (1, 3, 9, 9), False)]
)
def test_a_pad_is_kept_out_only_when_the_runtime_would_refuse_it(model, shape, kept_out):
    pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e xnnpack)")
    torch.manual_seed(0)
    inputs = (torch.randn(*shape),)
    converted = _converted(model(), inputs)
    program = qx.to_executorch(converted, inputs)
    assert (PAD in program.not_delegated) is kept_out, program.summary()
    assert (PAD in program.delegated) is not kept_out, program.summary()
    (out,) = program.load()(*inputs)
    assert out.shape == converted(*inputs).shape


@pytest.mark.executorch
def test_the_peers_program_loads_through_to_executorch(swin):
    """ExecuTorch's own XNNPACKQuantizer (torchao's prepare / convert) on the same windows: its
    program, refused at load when lowered with ExecuTorch 1.5.1's plain XnnpackPartitioner
    (measured, as ours was), loads through ``to_executorch``."""
    xq = pytest.importorskip("executorch.backends.xnnpack.quantizer.xnnpack_quantizer")
    ao = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
    quantizer = xq.XNNPACKQuantizer().set_global(xq.get_symmetric_quantization_config(is_per_channel=True))
    converted = _converted(swin[0], SWIN_INPUTS, quantizer, ao)
    program = qx.to_executorch(converted, SWIN_INPUTS)
    assert PAD in program.not_delegated, program.summary()
    (out,) = program.load()(*SWIN_INPUTS)
    assert out.shape == converted(*SWIN_INPUTS).shape

"""Memory at size (issue 25), proved at small size by instrumenting, not timing:

- convert quantizes a weight in blocks of rows (``_modules/chunked_quantize``), with results
  identical to the quantize op on the whole tensor, for every op and layout it slices;
- converting and calibrating a bf16 model never makes a float32 copy of a whole weight
  (every op's output is recorded by a dispatch mode), and the converted bf16 model computes
  what it did before the change;
- the per-channel observer's min/max of a bf16 weight are those of its float32 copy.
"""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import quantweave as qw
import quantweave.convert as convert_module
from quantweave._modules import chunked_quantize
from quantweave._modules.chunked_quantize import quantize_constant
from quantweave.authoring import annotate_input_qspec_map, dequantize_ops
from quantweave.observers import PerChannelMinMaxObserver, PerGroupMinMaxObserver
from quantweave.plugin_api import mark_annotated
from quantweave.testing.reference import weight_spec
from tests.helpers import export

dequantize_ops()  # registers torch.ops.quantized_decomposed
qd = torch.ops.quantized_decomposed
aten = torch.ops.aten


class Largest(TorchDispatchMode):
    """Records the largest float32 tensor any op returns (``float32``) and the largest input
    a quantize op is given (``quantized``: the op's float32 temporaries are of its size)."""

    def __init__(self):
        super().__init__()
        self.float32 = self.quantized = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "quantized_decomposed" and func.__name__.startswith("quantize_"):
            self.quantized = max(self.quantized, args[0].numel())
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.float32 = max(self.float32, t.numel())
        return out


def _cases(dtype):
    torch.manual_seed(0)
    w = (torch.randn(37, 64) * 3).to(dtype)
    rows = torch.rand(37, dtype=torch.float64) * 0.05 + 0.01
    cols = torch.rand(64, dtype=torch.float64) * 0.05 + 0.01
    zp_rows, zp_cols = torch.randint(-3, 3, (37,)), torch.randint(-3, 3, (64,))
    groups = torch.rand(37, 4, dtype=torch.float32) * 0.1 + 0.01
    return {
        "per_tensor": (qd.quantize_per_tensor.default, w, (0.02, 3, -128, 127, torch.int8)),
        "per_channel_axis0": (
            qd.quantize_per_channel.default,
            w,
            (rows, zp_rows, 0, -128, 127, torch.int8),
        ),
        "per_channel_axis1": (
            qd.quantize_per_channel.default,
            w,
            (cols, zp_cols, 1, -127, 127, torch.int8),
        ),
        "per_channel_3d": (
            qd.quantize_per_channel.default,
            w.reshape(37, 8, 8),
            (rows, zp_rows, 0, -127, 127, torch.int8),
        ),
        "per_group": (
            qd.quantize_per_channel_group.default,
            w,
            (groups, torch.zeros_like(groups), -8, 7, torch.int8, 16),
        ),
        "per_group_flat_qparams": (
            qd.quantize_per_channel_group.default,
            w,
            (groups.reshape(-1), torch.zeros(37 * 4), -8, 7, torch.int8, 16),
        ),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "case",
    ["per_tensor", "per_channel_axis0", "per_channel_axis1", "per_channel_3d", "per_group", "per_group_flat_qparams"],
)
def test_quantizing_in_blocks_gives_the_ops_result_on_the_whole_tensor(case, dtype, monkeypatch):
    q_op, value, args = _cases(dtype)[case]
    with Largest() as blocks:
        blocked = quantize_constant(q_op, value, args, block_elements=5 * 64)  # blocks of 5 rows of 64
    with Largest() as at_once:
        whole = q_op(value, *args)
    assert blocks.quantized == 5 * 64 and at_once.quantized == value.numel()  # really blocked
    assert blocked.dtype == whole.dtype and blocked.shape == whole.shape
    assert torch.equal(blocked, whole)


def test_small_tensors_and_unknown_ops_are_quantized_whole():
    w = torch.randn(4, 8)
    calls = []

    def op(x, *rest):
        calls.append(x.shape)
        return x.round()

    assert torch.equal(quantize_constant(op, w, (), block_elements=64), w.round())  # 32 elements <= 64
    assert torch.equal(quantize_constant(op, w, (), block_elements=8), w.round())  # not a quantize op: whole
    assert calls == [(4, 8), (4, 8)]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(96, 64)
        self.fc = nn.Linear(64, 128)
        self.head = nn.Linear(128, 96, bias=False)

    def forward(self, tokens):
        return self.head(torch.relu(self.fc(self.emb(tokens))))


class WeightQuantizer(qw.Quantizer):
    """Weight-only: per-channel int8 linear weights, 4-bit group-wise embedding table."""

    def annotate(self, model):
        per_channel = weight_spec(qw, PerChannelMinMaxObserver, narrow=True)
        group = qw.QuantizationSpec(
            dtype=torch.int8,
            quant_min=-8,
            quant_max=7,
            qscheme=torch.per_channel_symmetric,
            ch_axis=0,
            group_size=16,
            observer_or_fake_quant_ctr=PerGroupMinMaxObserver,
        )
        for node in model.graph.nodes:
            if node.op == "call_function" and node.target == aten.linear.default:
                annotate_input_qspec_map(node, node.args[1], per_channel)
                mark_annotated(node)
            elif node.op == "call_function" and node.target == aten.embedding.default:
                annotate_input_qspec_map(node, node.args[0], group)
                mark_annotated(node)
        return model


@pytest.fixture(scope="module")
def bf16_flow():
    torch.manual_seed(0)
    model = Net().to(torch.bfloat16).eval()
    tokens = torch.randint(0, 96, (2, 8))
    prepared = qw.prepare_pt2e(export(model, tokens), WeightQuantizer())
    return model, tokens, prepared


def test_calibrating_and_converting_a_bf16_model_never_copies_a_whole_weight_to_float32(bf16_flow, monkeypatch):
    model, tokens, prepared = bf16_flow
    smallest_weight = min(p.numel() for p in model.parameters() if p.dim() == 2)  # 64 * 128 = 8192
    with Largest() as calibrating:
        prepared(tokens)
    monkeypatch.setattr(chunked_quantize, "BLOCK_ELEMENTS", 16 * 64)  # blocks of 1024 elements at most
    with Largest() as converting:
        converted = qw.convert_pt2e(prepared)
    assert calibrating.float32 < smallest_weight, calibrating.float32  # the observers copied no weight
    assert converting.float32 < smallest_weight, converting.float32
    # each weight was quantized one block at a time (in convert's block buffer, not by the op: its quantizes ran
    # as float32 ops of one block each); any quantize op called saw one block at most
    assert 0 < converting.float32 <= 16 * 64 and converting.quantized <= 16 * 64, converting.float32
    frozen = [t for name, t in converted.named_buffers() if "frozen" in name]
    assert len(frozen) == 3 and all(t.dtype == torch.int8 for t in frozen)
    assert sum(t.numel() for t in frozen) == sum(p.numel() for p in model.parameters() if p.dim() == 2)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # the caller's model is as it was


def test_a_bf16_model_converts_to_what_the_whole_tensor_ops_give(bf16_flow, monkeypatch):
    _, tokens, prepared = bf16_flow
    monkeypatch.setattr(chunked_quantize, "BLOCK_ELEMENTS", 16 * 64)
    blocked = qw.convert_pt2e(prepared)
    monkeypatch.setattr(chunked_quantize, "BLOCK_ELEMENTS", 1 << 40)  # never blocked: the op on each weight
    whole = qw.convert_pt2e(prepared)
    ours = {n: t for n, t in blocked.named_buffers() if "frozen" in n}
    theirs = {n: t for n, t in whole.named_buffers() if "frozen" in n}
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert torch.equal(blocked(tokens), whole(tokens)) and blocked(tokens).dtype == torch.bfloat16


def test_per_channel_observer_of_a_bf16_weight_records_its_float32_min_max():
    torch.manual_seed(0)
    w = torch.randn(48, 40).to(torch.bfloat16)
    w[3, 5] = float("nan")
    for axis in (0, 1):
        ours, of_float = PerChannelMinMaxObserver(ch_axis=axis), PerChannelMinMaxObserver(ch_axis=axis)
        ours(w)
        ours(w * 2)
        of_float(w.float())
        of_float((w * 2).float())
        assert ours.min_val.dtype == torch.float32
        assert torch.equal(ours.min_val.nan_to_num(7.0), of_float.min_val.nan_to_num(7.0))
        assert torch.equal(ours.max_val.nan_to_num(7.0), of_float.max_val.nan_to_num(7.0))


def _affine_cases(dtype):
    torch.manual_seed(1)
    w = torch.randn(37, 64) * 3
    w[0, :4] = torch.tensor([0.5, 1.5, -2.5, 2.0]) * 0.02  # ties: round half to even
    w[1, 0], w[1, 1] = float("inf"), float("-inf")  # clamped
    w = w.to(dtype)
    scales = torch.rand(37) * 0.05 + 0.01
    scales[0] = 0.02
    cases = {
        "per_tensor": (qd.quantize_per_tensor.default, w, (0.02, 3, -128, 127, torch.int8)),
        "per_tensor_uint8": (qd.quantize_per_tensor.default, w, (0.03, 128, 0, 255, torch.uint8)),
        "per_channel": (
            qd.quantize_per_channel.default,
            w,
            (scales, torch.randint(-3, 3, (37,)), 0, -127, 127, torch.int8),
        ),
        "per_channel_int32_zp": (
            qd.quantize_per_channel.default,
            w,
            (scales, torch.randint(-3, 3, (37,), dtype=torch.int32), 0, -128, 127, torch.int8),
        ),
        "per_channel_3d": (
            qd.quantize_per_channel.default,
            w.reshape(37, 8, 8),
            (scales, torch.zeros(37, dtype=torch.int64), 0, -8, 7, torch.int8),
        ),
    }
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "case", ["per_tensor", "per_tensor_uint8", "per_channel", "per_channel_int32_zp", "per_channel_3d"]
)
def test_quantizing_in_the_block_buffer_gives_the_ops_integers(case, dtype):
    q_op, value, args = _affine_cases(dtype)[case]
    workspace = chunked_quantize.Workspace(5 * 64)  # blocks of 5 rows of 64
    with Largest() as blocks:
        result = chunked_quantize.quantize_affine_rows(q_op, value, args, workspace)
    assert result is not None and blocks.quantized == 0  # not the op
    if dtype == torch.float32:  # (the whole weight's views are float32 too)
        assert blocks.float32 == value.numel()
    else:  # no float32 copy of the weight, only of blocks of 5 rows
        assert blocks.float32 == 5 * 64
    whole = q_op(value, *args)
    assert result.dtype == whole.dtype and result.shape == whole.shape
    assert torch.equal(result, whole)


def test_what_the_block_buffer_does_not_handle_is_left_to_the_caller():
    q_op, w, args = _affine_cases(torch.float32)["per_channel"]
    scales, zero_points = args[0], args[1]
    workspace = chunked_quantize.Workspace(5 * 64)
    assert (
        chunked_quantize.quantize_affine_rows(q_op, w, args, chunked_quantize.Workspace(w.numel())) is None
    )  # 1 block
    assert chunked_quantize.quantize_affine_rows(q_op, w.double(), args, workspace) is None  # float64 weight
    assert chunked_quantize.quantize_affine_rows(q_op, w.t(), args, workspace) is None  # not contiguous
    assert chunked_quantize.quantize_affine_rows(q_op, w, (scales.double(), *args[1:]), workspace) is None
    assert chunked_quantize.quantize_affine_rows(q_op, w, (scales, zero_points.double(), *args[2:]), workspace) is None
    assert chunked_quantize.quantize_affine_rows(q_op, w, (*args[:2], 1, *args[3:]), workspace) is None  # axis 1
    assert chunked_quantize.quantize_affine_rows(q_op, w, (*args[:3], -300, 127, torch.int8), workspace) is None
    assert chunked_quantize.quantize_affine_rows(qd.quantize_per_channel_group.default, w, args, workspace) is None


def test_one_block_buffer_serves_every_weight_a_convert_quantizes(bf16_flow, monkeypatch):
    """Convert allocates the int8 results and one float32 block buffer: every block-sized float32
    tensor its quantizes make is a view of that one buffer (nothing freed between two results)."""
    _, _, prepared = bf16_flow
    monkeypatch.setattr(chunked_quantize, "BLOCK_ELEMENTS", 16 * 64)
    storages, kept = set(), []

    class Storages(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() > 512:  # not qparams (<= 384)
                    kept.append(t)  # alive: a freed temporary's address cannot be reused by the next
                    storages.add(t.untyped_storage().data_ptr())
            return out

    with Storages():
        converted = qw.convert_pt2e(prepared)
    assert len(storages) == 1, storages
    assert sum("frozen" in name for name, _ in converted.named_buffers()) == 3


def test_qparams_an_observer_computes_become_buffers_without_a_copy(monkeypatch):
    """A 4-bit table's scales and zero points are new tensors: convert registers them as they
    are (a copy of each cost an LLM's convert a fresh allocation per group-wise weight)."""
    torch.manual_seed(0)
    prepared = qw.prepare_pt2e(export(Net().eval(), torch.randint(0, 96, (2, 8))), WeightQuantizer())
    returned = []
    computed = PerGroupMinMaxObserver.calculate_qparams

    def recording(self):
        qparams = computed(self)
        returned.extend(qparams)
        return qparams

    monkeypatch.setattr(PerGroupMinMaxObserver, "calculate_qparams", recording)
    monkeypatch.setattr(convert_module, "_COPIED_ANYWAY", 1)  # the table's 384 groups count as large
    converted = qw.convert_pt2e(prepared)
    held = {b.untyped_storage().data_ptr() for b in converted.buffers()}
    assert len(returned) == 2 and all(t.untyped_storage().data_ptr() in held for t in returned)


class HeldQParams(PerChannelMinMaxObserver):
    """Returns qparams it holds: its own buffer (scale) and a plain attribute (zero point)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.register_buffer("held_scale", torch.tensor([]))
        self.held_zero_point = torch.tensor([])

    def calculate_qparams(self):
        scale, zero_point = super().calculate_qparams()
        self.held_scale, self.held_zero_point = scale, zero_point
        return self.held_scale, self.held_zero_point


def test_qparams_an_observer_holds_are_copied_into_the_converted_model(monkeypatch):
    """Writing into the converted model (``load_state_dict`` copies in place) must not reach
    the prepared model's observers: qparams they hold are registered as copies."""

    class Quantizer(qw.Quantizer):
        def annotate(self, model):
            spec = weight_spec(qw, HeldQParams, narrow=True)
            for node in model.graph.nodes:
                if node.op == "call_function" and node.target == aten.linear.default:
                    annotate_input_qspec_map(node, node.args[1], spec)
                    mark_annotated(node)
            return model

    torch.manual_seed(0)
    tokens = torch.randint(0, 96, (2, 8))
    prepared = qw.prepare_pt2e(export(Net().eval(), tokens), Quantizer())
    prepared(tokens)
    monkeypatch.setattr(convert_module, "_COPIED_ANYWAY", 1)  # 128 and 96 channels count as large
    converted = qw.convert_pt2e(prepared)
    observers = [m for m in prepared.modules() if isinstance(m, HeldQParams)]
    assert observers and all(m.held_scale.numel() for m in observers)
    before = [(m.held_scale.clone(), m.held_zero_point.clone()) for m in observers]
    with torch.no_grad():
        for name, buffer in converted.named_buffers():
            if "_scale_" in name or "_zero_point_" in name:
                buffer.fill_(7)
    assert all(
        torch.equal(m.held_scale, scale) and torch.equal(m.held_zero_point, zero_point)
        for m, (scale, zero_point) in zip(observers, before, strict=True)
    )


def test_qparams_registered_twice_are_copied_the_second_time():
    gm = export(Net().eval(), torch.randint(0, 96, (2, 8)))
    run = convert_module._Run(gm, {})
    observer = PerGroupMinMaxObserver(group_size=16)
    scale = torch.rand(convert_module._COPIED_ANYWAY)
    first, second = run.own_buffer(scale, observer), run.own_buffer(scale, observer)  # a shared observer
    assert first.untyped_storage().data_ptr() == scale.untyped_storage().data_ptr()
    assert second.untyped_storage().data_ptr() != scale.untyped_storage().data_ptr()
    assert torch.equal(second, scale)
    table = gm.get_parameter("emb.weight")  # 96 x 64: a weight's storage is never the converted model's qparams
    assert (
        run.own_buffer(table.reshape(-1), observer).untyped_storage().data_ptr() != table.untyped_storage().data_ptr()
    )
    small = torch.rand(convert_module._COPIED_ANYWAY - 1)
    assert run.own_buffer(small, observer).untyped_storage().data_ptr() != small.untyped_storage().data_ptr()

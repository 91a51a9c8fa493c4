"""Group-wise weights quantized in fewer passes (``_modules/group_quantize``, issue 25): every
integer is ``quantize_per_channel_group``'s, for the inputs convert gives it and the awkward
ones (ties, values beyond the range, infinities, signed zeros, zero points, every float
dtype); a NaN raises the op's error; what it does not handle goes to the op; and a model
converted through it stores what the op stores. The group observer reduces a weight seen on
every calibration batch once, to the same min/max."""

import pytest
import torch

import quantweave as qw
from quantweave._modules import chunked_quantize
from quantweave._modules.group_quantize import quantize_groups, quantize_weight
from quantweave.authoring import annotate_input_qspec_map, dequantize_ops
from quantweave.observers import PerGroupMinMaxObserver
from quantweave.plugin_api import mark_annotated
from tests.helpers import export

dequantize_ops()  # registers torch.ops.quantized_decomposed
qd = torch.ops.quantized_decomposed
OP = qd.quantize_per_channel_group.default


def _weight(dtype, rows=37, columns=64, group=16):
    torch.manual_seed(0)
    scales = torch.rand(rows, columns // group) * 0.1 + 0.01
    w = torch.randn(rows, columns) * 0.4
    scales[0] = 2.0**-5  # exact ties: (k + 0.5) steps of a power of two, both signs
    w[0, :24] = (torch.arange(-12, 12).float() + 0.5) * 2.0**-5
    w[1, 0], w[1, 1], w[1, 2], w[1, 3] = 0.0, -0.0, float("inf"), float("-inf")  # signed zeros, infinities
    w[2] *= 50  # far beyond the range: clamped
    scales[3] = torch.tensor([1e-40, 3e38, 1e-45, 2.0**-126])  # reciprocals: inf, subnormal, inf, a power of two
    return w.to(dtype), scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("zero_points", ["zeros", "int32", "int64"])
@pytest.mark.parametrize("flat", [False, True])
def test_the_integers_are_the_ops(dtype, zero_points, flat):
    w, scales = _weight(dtype)
    zp = {
        "zeros": torch.zeros(scales.shape, dtype=torch.int32),
        "int32": torch.randint(-4, 4, scales.shape, dtype=torch.int32),
        "int64": torch.randint(-4, 4, scales.shape, dtype=torch.int64),
    }[zero_points]
    if flat:
        scales, zp = scales.reshape(-1), zp.reshape(-1)
    for quant_min, quant_max, out_dtype in [(-8, 7, torch.int8), (-128, 127, torch.int8), (0, 15, torch.uint8)]:
        args = (scales, zp, quant_min, quant_max, out_dtype, 16)
        ours = quantize_groups(w, args, block_elements=5 * 64)  # blocks of 5 rows, the last one of 2
        assert ours is not None
        theirs = OP(w, *args)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert torch.equal(ours, theirs), (quant_min, quant_max)


def test_a_non_contiguous_weight_gives_the_ops_integers():
    w, scales = _weight(torch.float32)
    strided = w.t().contiguous().t()  # the same values, stored column by column
    assert not strided.is_contiguous()
    args = (scales, torch.zeros(scales.shape, dtype=torch.int32), -8, 7, torch.int8, 16)
    ours = quantize_groups(strided, args, block_elements=5 * 64)  # blocks of 5 rows, the last one of 2
    assert ours is not None and torch.equal(ours, OP(w, *args))


def test_a_nan_raises_the_ops_assertion_error():
    w, scales = _weight(torch.float32)
    w[20, 7] = float("nan")
    args = (scales, torch.zeros(scales.shape, dtype=torch.int32), -8, 7, torch.int8, 16)
    with pytest.raises(AssertionError, match="NaN"):
        OP(w, *args)
    with pytest.raises(AssertionError, match="NaN"):
        quantize_groups(w, args, block_elements=5 * 64)
    w[20, 7] = 0.0
    w[30, 0], w[30, 1] = float("inf"), float("-inf")  # a NaN sum without a NaN: quantized
    assert torch.equal(quantize_groups(w, args, block_elements=5 * 64), OP(w, *args))


def test_what_it_does_not_handle_goes_to_the_op():
    w, scales = _weight(torch.float32)
    zp = torch.zeros(scales.shape, dtype=torch.int32)
    args = (scales, zp, -8, 7, torch.int8, 16)
    assert quantize_groups(w.double(), args, block_elements=64) is None  # float64 weight
    assert quantize_groups(w, (scales.double(), *args[1:]), block_elements=64) is None  # float64 scales
    assert quantize_groups(w, (scales, zp.float(), *args[2:]), block_elements=64) is None  # float zero points
    assert quantize_groups(w, (*args[:5], 48), block_elements=64) is None  # groups that do not divide a row
    assert quantize_groups(w.reshape(37, 4, 16), args, block_elements=64) is None  # not 2-D
    assert quantize_groups(w, (scales[:-1], *args[1:]), block_elements=64) is None  # scales of other groups
    assert quantize_groups(w, args, block_elements=32) is None  # rows longer than a block
    for value, args_ in [(w.double(), args), (w, (scales.double(), *args[1:]))]:
        calls = []
        with _Recorder(calls):
            result = quantize_weight(OP, value, args_)  # not handled: the op
        assert calls == [OP] and torch.equal(result, OP(value, *args_))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_weight_of_one_block_or_less_is_quantized_here_too(dtype):
    """Small weights (an LLM's projections at small sizes) take the same path in one block:
    fewer ops than the op's six passes, the same integers, and the op's NaN error."""
    w, scales = _weight(dtype)
    args = (scales, torch.randint(-4, 4, scales.shape, dtype=torch.int32), -8, 7, torch.int8, 16)
    assert torch.equal(quantize_groups(w, args, block_elements=w.numel()), OP(w, *args))  # exactly one block
    calls = []
    with _Recorder(calls):
        ours = quantize_weight(OP, w, args)  # BLOCK_ELEMENTS is far more than the weight
    assert calls == [] and torch.equal(ours, OP(w, *args))
    w[3, 3] = float("nan")
    with pytest.raises(AssertionError, match="NaN"):
        quantize_groups(w, args, block_elements=w.numel())


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the quantized_decomposed ops called."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "quantized_decomposed":
            self.calls.append(func)
        return func(*args, **(kwargs or {}))


class _Tables(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(96, 64)
        self.head = torch.nn.Linear(64, 96, bias=False)

    def forward(self, tokens):
        return self.head(self.emb(tokens))


class _GroupQuantizer(qw.Quantizer):
    def __init__(self, qscheme):
        self.spec = qw.QuantizationSpec(
            dtype=torch.int8,
            quant_min=-8,
            quant_max=7,
            qscheme=qscheme,
            ch_axis=0,
            group_size=16,
            observer_or_fake_quant_ctr=PerGroupMinMaxObserver,
        )

    def annotate(self, model):
        for node in model.graph.nodes:
            if node.target in (torch.ops.aten.embedding.default, torch.ops.aten.linear.default):
                weight = node.args[0] if node.target == torch.ops.aten.embedding.default else node.args[1]
                annotate_input_qspec_map(node, weight, self.spec)
                mark_annotated(node)
        return model


@pytest.mark.parametrize("qscheme", [torch.per_channel_symmetric, torch.per_channel_affine])
def test_a_converted_model_stores_what_the_op_stores(qscheme, monkeypatch):
    torch.manual_seed(0)
    tokens = torch.randint(0, 96, (2, 8))
    prepared = qw.prepare_pt2e(export(_Tables().eval(), tokens), _GroupQuantizer(qscheme))
    monkeypatch.setattr(chunked_quantize, "BLOCK_ELEMENTS", 1024)  # 6144-element weights: 6 blocks each
    calls = []
    with _Recorder(calls):
        fast = qw.convert_pt2e(prepared)
    assert OP not in calls  # both weights went through quantize_groups
    monkeypatch.setattr("quantweave._modules.group_quantize.quantize_groups", lambda *a: None)
    with _Recorder(calls):
        slow = qw.convert_pt2e(prepared)
    assert OP in calls  # the op, block by block, as before
    assert fast.code == slow.code
    ours, theirs = fast.state_dict(), slow.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    frozen = [t for k, t in ours.items() if "frozen" in k]
    assert len(frozen) == 2 and all(t.dtype == torch.int8 and t.shape == (96, 64) for t in frozen)
    assert torch.equal(fast(tokens), slow(tokens))


def test_the_group_observer_reduces_an_unchanged_weight_once():
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(8, 32, generator=gen)
    first = weight.clone()
    observer, fresh = PerGroupMinMaxObserver(group_size=8), PerGroupMinMaxObserver(group_size=8)
    observer(weight)
    calls = []
    original_amin = torch.Tensor.amin
    try:
        torch.Tensor.amin = lambda *a, **k: calls.append(1) or original_amin(*a, **k)  # type: ignore[method-assign]
        observer(weight)  # the same tensor, unchanged: skipped
        assert calls == []
        other = torch.randn(8, 32, generator=gen) * 5
        observer(other)  # another tensor: observed
        assert len(calls) == 1
        observer(weight)  # observed again (the last tensor seen was another one)
        assert len(calls) == 2
        with torch.no_grad():
            weight.mul_(3)  # changed in place (a QAT / optimizer step): observed again
        observer(weight)
        assert len(calls) == 3
    finally:
        torch.Tensor.amin = original_amin  # type: ignore[method-assign]
    for x in (first, other, first, weight):  # what it saw, each observed
        fresh(x)
    assert torch.equal(observer.min_val, fresh.min_val) and torch.equal(observer.max_val, fresh.max_val)
    assert all(torch.equal(a, b) for a, b in zip(observer.calculate_qparams(), fresh.calculate_qparams(), strict=True))


def test_qparams_checks_give_the_float64_verdict():
    """convert's scale / zero-point checks (one reduction in the tensor's own dtype) accept and
    reject exactly what checking a float64 copy did."""
    from quantweave._modules.group_quantize import qparams_valid

    def float64_verdict(value, positive):
        t = torch.as_tensor(value, dtype=torch.float64)
        if positive:
            return t.numel() > 0 and bool(torch.isfinite(t).all() and (t > 0).all())
        return bool(torch.isfinite(t).all())

    inf, nan = float("inf"), float("nan")
    values = [0.5, 0.0, -1.0, inf, nan, 3, 0, [], [0.1, 0.2], [0.1, 0.0], [0.1, inf], [-inf, 0.1], [0.1, nan]]
    tensors = [torch.tensor(v, dtype=d) for v in values for d in (torch.float32, torch.bfloat16, torch.float16)]
    tensors += [torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0, 2]), torch.tensor([-1]), torch.tensor([])]
    tensors += [
        torch.rand(300, 4) + 0.01,
        (torch.rand(300, 4) + 0.01).index_put_((torch.tensor([7]),), torch.tensor(nan)),
    ]
    for value in [*values, *tensors]:
        for positive in (True, False):
            assert qparams_valid(value, positive) == float64_verdict(value, positive), (value, positive)


def test_is_calibrated_gives_the_isfinite_verdict():
    from quantweave.observers import is_calibrated

    inf, nan = float("inf"), float("nan")
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for low, high in [
            ([0.0, -1.0], [1.0, 2.0]),
            ([-inf, 0.0], [1.0, 1.0]),
            ([0.0, 0.0], [inf, 1.0]),
            ([nan], [1.0]),
        ]:
            obs = PerGroupMinMaxObserver(group_size=2)
            obs.min_val, obs.max_val = torch.tensor(low, dtype=dtype), torch.tensor(high, dtype=dtype)
            expected = bool(torch.isfinite(obs.min_val).all() and torch.isfinite(obs.max_val).all())
            assert is_calibrated(obs) == expected, (dtype, low, high)


def test_nan_check_left_out_only_where_the_observer_proves_there_is_none(monkeypatch):
    from quantweave._modules import group_quantize

    torch.manual_seed(0)
    tokens = torch.randint(0, 96, (2, 8))
    prepared = qw.prepare_pt2e(export(_Tables().eval(), tokens), _GroupQuantizer(torch.per_channel_symmetric))
    monkeypatch.setattr(chunked_quantize, "BLOCK_ELEMENTS", 1024)
    seen = []
    original = group_quantize.quantize_groups
    monkeypatch.setattr(group_quantize, "quantize_groups", lambda *a: seen.append(a[4]) or original(*a))
    qw.convert_pt2e(prepared)
    assert seen == [True, True]  # both weights observed at convert, on these very tensors, no NaN

    observer = PerGroupMinMaxObserver(group_size=16)
    weight = torch.randn(8, 32)
    observer(weight)
    assert group_quantize.observed_nan_free(observer, weight)
    assert not group_quantize.observed_nan_free(observer, weight.clone())  # another tensor
    weight.add_(0)  # written since it was observed
    assert not group_quantize.observed_nan_free(observer, weight)
    with_nan = torch.randn(8, 32)
    with_nan[3, 5] = float("nan")
    observer = PerGroupMinMaxObserver(group_size=16)
    observer(with_nan)
    assert not group_quantize.observed_nan_free(observer, with_nan)


def test_a_nan_weight_is_still_rejected_before_any_quantize(monkeypatch):
    torch.manual_seed(0)
    tokens = torch.randint(0, 96, (2, 8))
    model = _Tables().eval()
    with torch.no_grad():
        model.emb.weight[5, 3] = float("nan")
    prepared = qw.prepare_pt2e(export(model, tokens), _GroupQuantizer(torch.per_channel_symmetric))
    monkeypatch.setattr(chunked_quantize, "BLOCK_ELEMENTS", 1024)
    with pytest.raises(qw.ObserverNotCalibratedError, match=r"activation_post_process_0.*emb_weight.*NaN"):
        qw.convert_pt2e(prepared)

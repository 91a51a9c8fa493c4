"""quantweave_x86.lower: compiled int8, no global side effects, callers' inputs untouched."""

import subprocess
import sys

import pytest
import torch
import torch._inductor.config as inductor_config

import quantweave as qw
from quantweave.testing.inspect import sqnr
from quantweave.testing.models import calibration_batches, encoder_block
from quantweave_x86 import X86InductorQuantizer, lower
from tests.helpers import assert_names, export


@pytest.fixture(scope="module")
def encoder_int8():
    torch.manual_seed(0)
    model = encoder_block(d_model=64, heads=4, ff=128)
    x = torch.randn(1, 16, 64)
    prepared = qw.prepare_pt2e(export(model, x), X86InductorQuantizer())
    for (batch,) in calibration_batches(model, 4):
        prepared(batch)
    converted = qw.convert_pt2e(prepared)
    return model, x, converted, lower(converted, (x,))


def test_lowered_int8_model_is_accurate(encoder_int8):
    model, x, converted, lowered = encoder_int8
    with torch.no_grad():
        reference = model(x)
    assert sqnr(reference, lowered(x)) > 25
    assert sqnr(converted(x), lowered(x)) > 25  # int8 kernels round differently from reference q/dq


def test_lowered_model_never_writes_into_the_callers_inputs(encoder_int8):
    # the encoder's residual `x + proj(y)` lowers to an int8 linear with a fused in-place
    # 'sum': without protection the compiled code writes the result into x's buffer
    _, x, _, lowered = encoder_int8
    original = x.clone()
    for _ in range(3):
        lowered(x)
    assert torch.equal(x, original)


def test_only_inputs_that_reach_float_ops_are_copied(encoder_int8):
    _, _, _, lowered = encoder_int8
    assert lowered.protected_inputs == (0,)  # x feeds layer_norm and the residual add

    class QuantizedOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x)

    model, x = QuantizedOnly().eval(), torch.randn(2, 8)
    prepared = qw.prepare_pt2e(export(model, x), X86InductorQuantizer())
    prepared(x)
    lowered = lower(qw.convert_pt2e(prepared), (x,))
    assert lowered.protected_inputs == ()  # x is only quantized: read, never written
    original = x.clone()
    lowered(x)
    assert torch.equal(x, original)


def test_lowering_changes_no_global_configuration(encoder_int8):
    assert inductor_config.freezing is False
    state = "(c.freezing, c.pre_grad_custom_pass, c.post_grad_custom_pre_pass)"
    code = f"import torch._inductor.config as c; before = {state}; import quantweave_x86; print(before == {state})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("True")


def test_lower_rejects_models_that_are_not_converted():
    class Tiny(torch.nn.Module):
        def forward(self, x):
            return x + 1

    gm = export(Tiny(), torch.randn(2))
    with pytest.raises(ValueError) as info:
        lower(gm, (torch.randn(2),))
    assert_names(info, "lower", "converted model", "no dequantize node")
    with pytest.raises(TypeError) as info:
        lower(Tiny(), (torch.randn(2),))
    assert_names(info, "lower", "GraphModule", "quantweave.convert_pt2e", "Tiny")


def test_int8_mixed_bf16_runs_and_stays_close(encoder_int8):
    model, x, converted, _ = encoder_int8
    mixed = lower(converted, (x,), bf16=True)
    original = x.clone()
    with torch.no_grad():
        reference = model(x)
    out = mixed(x)
    assert torch.equal(x, original)
    assert sqnr(reference, out.float()) > 15
    with pytest.raises(TypeError) as info:
        lower(converted, (x,), bf16="yes")
    assert_names(info, "lower", "bf16", "bool", "'yes'")


def _conv_relu_converted(quantizer):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    prepared = qw.prepare_pt2e(export(model, x), quantizer)
    prepared(x)
    return qw.convert_pt2e(prepared), x


@pytest.mark.parametrize("needs", [True, False], ids=["no-vnni", "vnni"])
def test_lower_warns_where_full_range_activations_would_saturate(monkeypatch, needs):
    """On a CPU without VNNI / AMX, uint8 activations in [0, 255] saturate oneDNN's 16-bit
    sums: lower names the quantize node and the fix; reduce_range=True lowers silently."""
    import warnings

    import quantweave_x86._lowering as lowering

    monkeypatch.setattr(lowering, "cpu_needs_reduce_range", lambda: needs)
    converted, x = _conv_relu_converted(X86InductorQuantizer())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lower(converted, (x,))
    saturating = [w for w in caught if issubclass(w.category, qw.MisuseWarning)]
    if needs:
        assert len(saturating) == 1
        message = str(saturating[0].message)
        assert "quantize_per_tensor" in message and "[0, 255]" in message and "reduce_range" in message
    else:
        assert not saturating
    reduced, x = _conv_relu_converted(X86InductorQuantizer(reduce_range=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lower(reduced, (x,))
    assert not [w for w in caught if issubclass(w.category, qw.MisuseWarning)]

"""torchvision's in-place residual block and GPT-2's Conv1D / ``x @ W`` quantized for XNNPACK,
lowered with ExecuTorch's XNNPACK partitioner and run on the ExecuTorch runtime (tox env
``xnnpack``): every quantized node is delegated and the runtime matches the converted model
(within one output quantization step; a signal-to-noise bound for dynamic linears)."""

import pytest
import torch

import quantweave as qw
import quantweave_xnnpack as qx
from quantweave.testing.inspect import sqnr
from tests.helpers import export
from tests.library_style import BasicBlock, Mlp

from ._cases import output_step

pytestmark = pytest.mark.executorch
pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e xnnpack)")

CASES = {
    "block_static": (BasicBlock, (1, 3, 8, 8), {"is_per_channel": True}),
    "mlp_static": (Mlp, (2, 4, 16), {"is_per_channel": True}),
    "mlp_dynamic": (Mlp, (2, 4, 16), {"is_per_channel": True, "is_dynamic": True}),
}


@pytest.fixture(scope="module")
def lowered():
    cache = {}

    def get(case):
        if case not in cache:
            factory, shape, config = CASES[case]
            torch.manual_seed(0)
            model, x = factory().eval(), torch.randn(shape)
            quantizer = qx.XNNPACKQuantizer().set_global(qx.get_symmetric_quantization_config(**config))
            prepared = qw.prepare_pt2e(export(model, x), quantizer)
            qw.calibrate(prepared, [(torch.randn_like(x),) for _ in range(4)], progress=False)
            converted = qw.convert_pt2e(prepared)
            cache[case] = (x, converted, qx.to_executorch(converted, (x,)))
        return cache[case]

    return get


@pytest.mark.parametrize("case", CASES)
def test_everything_is_delegated_and_the_runtime_matches(case, lowered):
    x, converted, program = lowered(case)
    assert program.delegate_count >= 1 and not program.not_delegated, program.summary()
    (out,) = program.load()(x)
    ref = converted(x)
    step = output_step(converted)
    if step is None:  # dynamic: the output is float
        assert sqnr(ref, out) > 30, f"SQNR {sqnr(ref, out):.1f} dB"
    else:
        assert ((out - ref).abs() / step).max().item() <= 1 + 1e-3

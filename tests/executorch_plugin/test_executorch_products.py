"""The ExecuTorch presets on GPT-2's Conv1D (addmm of a weight stored [in, out]) and a
hand-written ``x @ W`` head (tox env ``xnnpack``, marker ``executorch``): quantized as linears
by the XNNPACK member, delegated to XNNPACK whole, and run on the ExecuTorch runtime to the
converted model's values."""

import pytest
import torch

import quantweave as qw
import quantweave_executorch as qe
from quantweave.testing.inspect import sqnr
from tests.helpers import export
from tests.library_style import Mlp, TinyGPT

pytestmark = pytest.mark.executorch
pytest.importorskip("executorch.exir", reason="needs ExecuTorch 1.5.1 (tox -e xnnpack)")

CASES = {
    "llm": (TinyGPT, lambda: torch.randint(0, 64, (1, 8)), {}),
    "llm-linear4": (TinyGPT, lambda: torch.randint(0, 64, (1, 8)), {"linear_bits": 4}),
    "vision": (Mlp, lambda: torch.randn(2, 4, 16), {}),
}
PRODUCTS = ("addmm", "addmm_1", "addmm_2", "addmm_3", "matmul_2", "matmul_3")


@pytest.fixture(scope="module")
def flows():
    cache = {}

    def get(case):
        if case not in cache:
            factory, inputs, options = CASES[case]
            torch.manual_seed(0)
            model, x = factory().eval(), inputs()
            quantizer = qe.ExecuTorchQuantizer("vision" if case == "vision" else "llm", **options)
            prepared = qw.prepare_pt2e(export(model, x), quantizer)
            qw.calibrate(prepared, [(inputs(),) for _ in range(4)], progress=False)
            converted = qw.convert_pt2e(prepared)
            report = qw.annotation_report(prepared, quantizer)
            cache[case] = (x, report, converted, qe.to_executorch(converted, (x,)))
        return cache[case]

    return get


@pytest.mark.parametrize("case", CASES)
def test_products_with_a_constant_weight_are_quantized_delegated_and_run(case, flows):
    x, report, converted, program = flows(case)
    products = [r for r in report.nodes if r.op in ("aten.addmm.default", "aten.matmul.default")]
    weighted = [r for r in products if r.node in PRODUCTS or case == "vision"]
    assert weighted and all(r.status == "quantized" and r.quantizer == "xnnpack" for r in weighted), report.to_table()
    if case != "vision":  # every Conv1D and both x @ W; the attention's q @ k and a @ v stay float
        assert {r.node for r in weighted} == set(PRODUCTS)
    left = set(program.not_delegated)
    assert not any(op in left for op in ("aten.addmm.default", "aten.mm.default", "aten.linear.default")), left
    (out,) = program.load()(x)
    assert sqnr(converted(x), out) > 30, f"SQNR {sqnr(converted(x), out):.1f} dB"

import types

import pytest

torchao_pt2e = pytest.importorskip(
    "torchao.quantization.pt2e.quantize_pt2e", reason="peer tests need torchao (tox -e peer)"
)


@pytest.fixture(scope="session")
def torchao_api() -> types.SimpleNamespace:
    import torchao.quantization.pt2e.observer as ao_observer
    import torchao.quantization.pt2e.quantizer as ao_quantizer

    return types.SimpleNamespace(
        QuantizationSpec=ao_quantizer.QuantizationSpec,
        SharedQuantizationSpec=ao_quantizer.SharedQuantizationSpec,
        FixedQParamsQuantizationSpec=ao_quantizer.FixedQParamsQuantizationSpec,
        DerivedQuantizationSpec=ao_quantizer.DerivedQuantizationSpec,
        QuantizationAnnotation=ao_quantizer.QuantizationAnnotation,
        Quantizer=ao_quantizer.Quantizer,
        MinMaxObserver=ao_observer.MinMaxObserver,
        HistogramObserver=ao_observer.HistogramObserver,
        PerChannelMinMaxObserver=ao_observer.PerChannelMinMaxObserver,
    )


@pytest.fixture(scope="session")
def torchao_flow():
    return torchao_pt2e.prepare_pt2e, torchao_pt2e.convert_pt2e

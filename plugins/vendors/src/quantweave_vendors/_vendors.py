"""The vendor quantizers this plugin hosts: where each lives, what it needs, how it is built.

Nothing here imports a vendor package: :func:`available` checks with
:func:`importlib.util.find_spec` on top-level names (which reads the file system and runs
no package code) and with the module file's presence under the package's directory. The
vendor's module is imported by the builder, when a quantizer is first built.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _litert


@dataclass(frozen=True)
class Vendor:
    """One hosted quantizer.

    ``module``: the vendor's module (dotted), whose file must exist; ``requires``: the other
    top-level modules it imports (``find_spec`` must find them); ``build(**options)``: the
    vendor's quantizer object, configured; ``default``: the configuration without options, in
    words; ``options``: option name -> what it does; ``mode_options``: factory options per
    quantweave mode."""

    name: str
    vendor_class: str
    module: str
    requires: tuple[str, ...]
    build: Callable[..., Any]
    default: str
    options: Mapping[str, str] = field(default_factory=dict)
    mode_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    install: str = ""

    def missing(self) -> list[str]:
        """What is not installed (empty: the vendor's module can be imported)."""
        missing = [name for name in self.requires if not _module_available(name)]
        if not _module_file_exists(self.module):
            missing.insert(0, self.module)
        return missing


def _module_available(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _module_file_exists(dotted: str) -> bool:
    """True when ``dotted``'s source file is under its top-level package's directory
    (only the top-level package is located; no ``__init__`` runs)."""
    if dotted == _litert.MODULE:
        return _litert.module_file() is not None
    top, _, rest = dotted.partition(".")
    if dotted in sys.modules:
        return True
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return spec is not None and not rest
    parts = rest.split(".") if rest else []
    for root in spec.submodule_search_locations:
        base = Path(root).joinpath(*parts)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


# -- builders: each imports its vendor's module when called --------------------------------------


def _xnnpack(is_per_channel: bool = True, is_qat: bool = False, is_dynamic: bool = False, **config: Any) -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    cfg = get_symmetric_quantization_config(
        is_per_channel=is_per_channel, is_qat=is_qat, is_dynamic=is_dynamic, **config
    )
    return XNNPACKQuantizer().set_global(cfg)


def _vulkan(is_dynamic: bool = True, weight_bits: int = 8, **config: Any) -> Any:
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import (
        VulkanQuantizer,
        get_symmetric_quantization_config,
    )

    return VulkanQuantizer().set_global(
        get_symmetric_quantization_config(is_dynamic=is_dynamic, weight_bits=weight_bits, **config)
    )


def _qnn(quant_dtype: str = "", is_qat: bool = False, per_channel: bool | None = None, **config: Any) -> Any:
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype

    quantizer = QnnQuantizer()
    if quant_dtype or is_qat or per_channel is not None or config:
        dtype = QuantDtype[quant_dtype or "use_8a8w"]
        channel = (
            {} if per_channel is None else {"is_conv_per_channel": per_channel, "is_linear_per_channel": per_channel}
        )
        quantizer.set_default_quant_config(dtype, is_qat=is_qat, **channel, **config)
    return quantizer


def _arm_config(is_per_channel: bool, is_qat: bool, is_dynamic: bool, config: Mapping[str, Any]) -> Any:
    from executorch.backends.arm.quantizer import get_symmetric_quantization_config

    return get_symmetric_quantization_config(
        is_per_channel=is_per_channel, is_qat=is_qat, is_dynamic=is_dynamic, **config
    )


def _arm_tosa(
    tosa_spec: str = "TOSA-1.0+INT",
    is_per_channel: bool = True,
    is_qat: bool = False,
    is_dynamic: bool = False,
    **config: Any,
) -> Any:
    from executorch.backends.arm.quantizer import TOSAQuantizer
    from executorch.backends.arm.tosa.specification import TosaSpecification

    quantizer = TOSAQuantizer(TosaSpecification.create_from_string(tosa_spec))
    return quantizer.set_global(_arm_config(is_per_channel, is_qat, is_dynamic, config))


def _arm_ethos_u(
    target: str = "ethos-u55-128",
    is_per_channel: bool = True,
    is_qat: bool = False,
    is_dynamic: bool = False,
    **config: Any,
) -> Any:
    from executorch.backends.arm.ethosu import EthosUCompileSpec
    from executorch.backends.arm.quantizer import EthosUQuantizer

    quantizer = EthosUQuantizer(EthosUCompileSpec(target))
    return quantizer.set_global(_arm_config(is_per_channel, is_qat, is_dynamic, config))


def _cortex_m(**options: Any) -> Any:
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

    return CortexMQuantizer(**options)


def _samsung_enn(precision: str = "A8W8", is_per_channel: bool = True, is_qat: bool = False) -> Any:
    from executorch.backends.samsung.quantizer import EnnQuantizer, Precision

    quantizer = EnnQuantizer()
    quantizer.setup_quant_params(Precision[precision], is_per_channel=is_per_channel, is_qat=is_qat)
    return quantizer


def _openvino(mode: str = "int8_sym", **options: Any) -> Any:
    from executorch.backends.openvino.quantizer import OpenVINOQuantizer, QuantizationMode

    return OpenVINOQuantizer(mode=QuantizationMode(mode), **options)


def _litert_pt2e(is_per_channel: bool = True, is_qat: bool = False, is_dynamic: bool = False) -> Any:
    module = _litert.load_pt2e_quantizer_module()
    config = module.get_symmetric_quantization_config(
        is_per_channel=is_per_channel, is_qat=is_qat, is_dynamic=is_dynamic
    )
    return module.PT2EQuantizer().set_global(config)


_SYM = {
    "is_per_channel": "per-channel int8 weights (default True); False: per-tensor",
    "is_qat": "fake-quantize for QAT (mode 'qat')",
    "is_dynamic": "dynamic activations (mode 'dynamic')",
}
_ET = "pip install --no-deps torchao==0.18.0 executorch==1.5.1; pip install ruamel.yaml flatbuffers tabulate"

VENDORS: tuple[Vendor, ...] = (
    Vendor(
        "executorch-xnnpack",
        "XNNPACKQuantizer",
        "executorch.backends.xnnpack.quantizer.xnnpack_quantizer",
        ("torchao",),
        _xnnpack,
        "set_global(get_symmetric_quantization_config(is_per_channel=True)): int8 activations [-128, 127] "
        "(Histogram), int8 per-channel symmetric weights [-127, 127]",
        {**_SYM, "act_qmin/act_qmax/weight_qmin/weight_qmax": "ranges passed to get_symmetric_quantization_config"},
        {"dynamic": {"is_dynamic": True}, "qat": {"is_qat": True}},
        _ET,
    ),
    Vendor(
        "executorch-vulkan",
        "VulkanQuantizer",
        "executorch.backends.vulkan.quantizer.vulkan_quantizer",
        ("torchao",),
        _vulkan,
        "set_global(get_symmetric_quantization_config(is_dynamic=True, weight_bits=8)): dynamic int8 activations, "
        "int8 per-channel symmetric weights (is_dynamic=False is Vulkan's weight-only config)",
        {"is_dynamic": "False: weight-only (mode 'weight_only')", "weight_bits": "8 or 4"},
        {"dynamic": {}, "weight_only": {"is_dynamic": False}},
        _ET,
    ),
    Vendor(
        "executorch-qnn",
        "QnnQuantizer",
        "executorch.backends.qualcomm.quantizer.quantizer",
        ("torchao",),
        _qnn,
        "QnnQuantizer() as constructed: HTP backend, SM8750, its default 8a8w config",
        {
            "quant_dtype": "a QuantDtype name (use_8a8w, use_16a8w, use_16a4w, ...) for set_default_quant_config",
            "is_qat": "fake-quantize for QAT (mode 'qat')",
            "per_channel": "per-channel conv and linear weights",
        },
        {"qat": {"is_qat": True}},
        _ET,
    ),
    Vendor(
        "executorch-arm-tosa",
        "TOSAQuantizer",
        "executorch.backends.arm.quantizer.arm_quantizer",
        ("torchao", "tosa_serializer"),
        _arm_tosa,
        "TOSAQuantizer(TOSA-1.0+INT).set_global(get_symmetric_quantization_config()): int8 activations, "
        "int8 per-channel symmetric weights",
        {**_SYM, "tosa_spec": "the TOSA specification string (default 'TOSA-1.0+INT')"},
        {"dynamic": {"is_dynamic": True}, "qat": {"is_qat": True}},
        _ET + "; pip install tosa-tools",
    ),
    Vendor(
        "executorch-arm-ethos-u",
        "EthosUQuantizer",
        "executorch.backends.arm.quantizer.arm_quantizer",
        ("torchao", "tosa_serializer"),
        _arm_ethos_u,
        "EthosUQuantizer(EthosUCompileSpec('ethos-u55-128')).set_global(get_symmetric_quantization_config())",
        {**_SYM, "target": "the Ethos-U configuration (default 'ethos-u55-128')"},
        {"dynamic": {"is_dynamic": True}, "qat": {"is_qat": True}},
        _ET + "; pip install tosa-tools",
    ),
    Vendor(
        "executorch-cortex-m",
        "CortexMQuantizer",
        "executorch.backends.cortex_m.quantizer.quantizer",
        ("torchao", "tosa_serializer"),
        _cortex_m,
        "CortexMQuantizer(): int8 per-tensor elementwise ops, int8 per-channel convolutions",
        {"per_tensor_config": "the vendor's per-tensor QuantizationConfig", "use_explicit_layout": "vendor option"},
        {},
        _ET + "; pip install tosa-tools",
    ),
    Vendor(
        "executorch-samsung-enn",
        "EnnQuantizer",
        "executorch.backends.samsung.quantizer.quantizer",
        ("torchao",),
        _samsung_enn,
        "EnnQuantizer() with setup_quant_params(Precision.A8W8, is_per_channel=True)",
        {
            "precision": "a Precision name (A8W8)",
            "is_per_channel": "per-channel weights (default True)",
            "is_qat": "QAT (mode 'qat')",
        },
        {"qat": {"is_qat": True}},
        _ET,
    ),
    Vendor(
        "executorch-openvino",
        "OpenVINOQuantizer",
        "executorch.backends.openvino.quantizer.quantizer",
        ("torchao", "nncf", "openvino", "pytorch_tokenizers"),
        _openvino,
        "OpenVINOQuantizer(mode=QuantizationMode.INT8_SYM): NNCF's PERFORMANCE preset, int8 symmetric",
        {"mode": "a QuantizationMode value: int8_sym, int8_mixed, int8_transformer, int8wo_sym, int4wo_sym, ..."},
        {"weight_only": {"mode": "int8wo_sym"}},
        _ET + "; pip install --no-deps nncf==3.4.0 openvino==2026.4.1 pytorch-tokenizers==1.5.0 tokenizers "
        "sentencepiece tiktoken; pip install rich psutil safetensors scipy",
    ),
    Vendor(
        "litert-pt2e",
        "PT2EQuantizer",
        _litert.MODULE,
        ("torchao",),
        _litert_pt2e,
        "PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True)): int8 activations, "
        "int8 per-channel symmetric weights",
        _SYM,
        {"dynamic": {"is_dynamic": True}, "qat": {"is_qat": True}},
        "pip install --no-deps torchao==0.18.0 litert-torch==0.10.0 (the quantizer module is imported past "
        "litert_torch/__init__, so litert-torch's converter stack is not needed to quantize)",
    ),
)

BY_NAME: dict[str, Vendor] = {vendor.name: vendor for vendor in VENDORS}

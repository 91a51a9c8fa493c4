"""Which first-party quantizers run on the digits models, and how (shared by the tests and
by ``python -m tests.accuracy.results``, which prints the table in docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

#: the seed every reported figure uses (model initialisation and training shuffles; the
#: train/test split is always seed 0)
SEED = 0
MODEL_NAMES = ("cnn", "mlp", "attention")


def _x86(qat: bool) -> Any:
    from quantweave_x86 import X86InductorQuantizer

    return X86InductorQuantizer(is_qat=qat)


def _xnnpack(qat: bool) -> Any:
    from quantweave_xnnpack import XNNPACKQuantizer, get_symmetric_quantization_config

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_qat=qat))


def _template(qat: bool) -> Any:
    from quantweave_contrib_template.quantizer import TemplateQuantizer

    assert not qat
    return TemplateQuantizer()


#: plugin -> (module that must be importable, quantizer factory(qat), supports QAT)
PLUGINS: dict[str, tuple[str, Callable[[bool], Any], bool]] = {
    "x86": ("quantweave_x86", _x86, True),
    "xnnpack": ("quantweave_xnnpack", _xnnpack, True),
    "template": ("quantweave_contrib_template", _template, False),
}


def available(plugin: str) -> bool:
    return importlib.util.find_spec(PLUGINS[plugin][0]) is not None


def quantizer(plugin: str, qat: bool = False) -> Any:
    return PLUGINS[plugin][1](qat)

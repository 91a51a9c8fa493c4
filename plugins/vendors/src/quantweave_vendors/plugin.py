"""Entry point of quantweave-vendors (group ``quantweave``, name ``vendors``).

Loading the plugin imports no vendor package: a vendor's quantizer is registered when its
module and what it imports are installed (checked with ``importlib.util.find_spec`` on
top-level names and the module file's presence; no package code runs), and its module is
imported when the quantizer is first built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quantweave.plugin_api import Quantizer, QuantizerInfo, hookimpl

from ._vendors import VENDORS, Vendor

QUANTWEAVE_PLUGIN_API = 2


def _factory(vendor: Vendor) -> Callable[..., Quantizer]:
    def make_quantizer(**options: Any) -> Quantizer:
        from .hosted import HostedQuantizer

        return HostedQuantizer(vendor.build(**options), vendor.name)

    make_quantizer.__name__ = f"make_{vendor.name.replace('-', '_')}"
    make_quantizer.__doc__ = f"{vendor.vendor_class} ({vendor.module}), hosted: {vendor.default}"
    return make_quantizer


def hosted_vendors() -> list[Vendor]:
    """The vendors whose quantizer is importable here."""
    return [vendor for vendor in VENDORS if not vendor.missing()]


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name=vendor.name,
            factory=_factory(vendor),
            description=f"{vendor.vendor_class} ({vendor.module.split('.')[0]}), hosted unmodified; "
            f"capabilities derived by probing. Default: {vendor.default}",
            mode_options=vendor.mode_options,
        )
        for vendor in hosted_vendors()
    ]

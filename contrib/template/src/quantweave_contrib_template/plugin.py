"""Entry point module: registered under the ``quantweave`` entry-point group."""

from __future__ import annotations

from quantweave.plugin_api import QuantizerInfo, hookimpl

from .quantizer import CAPABILITIES, TemplateQuantizer

#: The quantweave plugin-API version this plugin was written for.
QUANTWEAVE_PLUGIN_API = 2


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name="template",
            factory=TemplateQuantizer,
            capabilities=CAPABILITIES,
            description="int8 symmetric conv2d/linear (static) and linear (dynamic)",
            mode_options={"dynamic": {"is_dynamic": True}},
        )
    ]

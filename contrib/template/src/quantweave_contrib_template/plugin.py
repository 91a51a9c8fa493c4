"""Entry point of quantweave-contrib-template
(group ``quantweave``, name ``template``).

quantweave imports this module when plugins are first asked for and calls its hooks
(see the hooks in quantweave's docs/plugins.md).
"""

from __future__ import annotations

from quantweave.plugin_api import QuantizerInfo, hookimpl

from .quantizer import CAPABILITIES, TemplateQuantizer

#: The quantweave plugin-API version this plugin targets (quantweave.plugin_api.PLUGIN_API_RELEASES).
QUANTWEAVE_PLUGIN_API = 2


@hookimpl
def quantweave_quantizers() -> list[QuantizerInfo]:
    return [
        QuantizerInfo(
            name="template",
            factory=TemplateQuantizer,  # factory(**options) -> quantweave.Quantizer
            capabilities=CAPABILITIES,
            description="int8 symmetric conv2d/linear (static) and linear (dynamic)",
            mode_options={"dynamic": {"is_dynamic": True}},  # the factory's options for each declared mode
        )
    ]

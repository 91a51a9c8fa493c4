"""Names that left ``quantweave``'s top level, and their new homes (deprecated aliases for one release).

``quantweave`` is the users' module; what plugin authors use lives in
:mod:`quantweave.plugin_api` (the contract) and :mod:`quantweave.authoring` (the kit), what
test authors use in :mod:`quantweave.testing`. The old names still resolve, with a
:class:`DeprecationWarning` naming the new home.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: The release in which the aliases below are removed.
REMOVED_IN = "0.2"

#: name -> the module it now lives in
MOVED: dict[str, str] = {
    **dict.fromkeys(
        (
            "ANNOTATED_BY_KEY",
            "ANNOTATION_KEY",
            "SKIP_REASON_KEY",
            "is_annotated",
            "mark_annotated",
            "set_skip_reason",
            "Capability",
            "FLOAT",
            "Mode",
            "Quant",
            "TensorQuant",
            "QuantizerInfo",
            "hookimpl",
        ),
        "quantweave.plugin_api",
    ),
    **dict.fromkeys(
        (
            "annotate_input_qspec_map",
            "annotate_output_qspec",
            "get_input_act_qspec",
            "get_output_act_qspec",
            "get_weight_qspec",
            "get_bias_qspec",
            "quantize_ops",
            "dequantize_ops",
        ),
        "quantweave.authoring",
    ),
    "PluginManager": "quantweave.testing",
}


def moved(name: str) -> Any:
    """The object ``quantweave.<name>`` used to be, with a DeprecationWarning naming its new
    home; AttributeError for a name that never was one of them."""
    home = MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'quantweave' has no attribute {name!r}")
    warnings.warn(
        f"quantweave.{name} has moved to {home}.{name} (import it from {home}); the alias in quantweave is "
        f"deprecated and will be removed in quantweave {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(home), name)

"""Per-token dynamic quantization (``QuantizationSpec(per_token=True)``): prepare's side.

A per-token spec is dynamic: its observer (a ``PlaceholderObserver``, as for any dynamic
spec) records nothing. :func:`mark_per_token_observers` sets :data:`PER_TOKEN_ATTR` on the
observer of every sharing group whose spec is per-token, and ``convert_pt2e`` reads it to
emit ``choose_qparams_per_token_asymmetric`` -> ``quantize_per_token`` ->
``dequantize_per_token`` instead of the per-tensor dynamic ops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..annotation import EdgeOrNode, QuantizationSpec, QuantizationSpecBase
from ..errors import AnnotationError
from .sharing import Groups, describe, group_specs

__all__ = ["PER_TOKEN_ATTR", "mark_per_token_observers"]

#: attribute prepare sets (True) on the observer module of a per-token dynamic spec
PER_TOKEN_ATTR = "per_token"


def mark_per_token_observers(
    specs: dict[EdgeOrNode, QuantizationSpecBase],
    observers: dict[EdgeOrNode, torch.nn.Module],
    is_qat: bool,
    label: Callable[[EdgeOrNode], str],
    groups: Groups | None = None,
) -> None:
    """Mark the observers of per-token specs (see the module docstring); ``groups``:
    ``group_specs(specs)`` when the caller has it.

    Raises AnnotationError naming the edge and quantizer when a per-token spec reaches
    ``prepare_qat_pt2e`` (the fake-quantizers of QAT simulate per-tensor qparams), or when a
    per-token and a per-tensor spec ended up sharing one observer."""
    per_token = [key for key, spec in specs.items() if getattr(spec, "per_token", False)]
    if not per_token:
        return
    if is_qat:
        key = per_token[0]
        raise AnnotationError(
            f"{describe(key)}: quantizer {label(key)!r} asks for per-token dynamic quantization "
            "(QuantizationSpec(per_token=True)), which is post-training only: use prepare_pt2e, or a "
            "per-tensor dynamic spec for QAT"
        )
    roots, concrete = group_specs(specs) if groups is None else groups
    for key, spec in specs.items():
        if not isinstance(spec, QuantizationSpec):
            continue
        group_spec = concrete[roots[key]]
        if bool(getattr(group_spec, "per_token", False)) != spec.per_token:
            other = next(k for k, s in specs.items() if s is group_spec)
            raise AnnotationError(
                f"{describe(key)}: quantizer {label(key)!r} put a spec with per_token={spec.per_token} on it, "
                f"but it shares one observer with {describe(other)}, whose spec has per_token="
                f"{getattr(group_spec, 'per_token', False)}; expected both per-token or both not "
                "(set allow_implicit_sharing=False on the consumer to keep them apart)"
            )
    for key in specs:
        if getattr(concrete[roots[key]], "per_token", False) and key in observers:
            setattr(observers[key], PER_TOKEN_ATTR, True)

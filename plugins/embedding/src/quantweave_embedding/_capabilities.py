"""What the embedding quantizer declares: cheap to import (the plugin hook needs only this)."""

from __future__ import annotations

from quantweave.authoring import Rule, RuleTable
from quantweave.plugin_api import Capability, Mode, TensorQuant

__all__ = ["TABLE", "TIED_NOTE", "declared_capabilities", "weight_tensor_quant"]

TIED_NOTE = (
    "a table whose weight another op also reads (a tied LM head) takes that op's per-row quantization when an "
    "earlier quantizer annotated it (tied='share'); tied='own' quantizes it as declared, tied='skip' leaves it float"
)


def weight_tensor_quant(bits: int = 8, group_size: int | None = None, symmetric: bool | None = None) -> TensorQuant:
    """How an ``EmbeddingQuantizer(bits, group_size, symmetric)`` quantizes a table:

    - 8-bit per row (``group_size=None``): uint8 [0, 255], float scale and zero point per row
      (``per_channel_affine_float_qparams`` on axis 0, ExecuTorch's ``embedding_byte`` form);
    - 8-bit group-wise: int8 [-128, 127] per row and group of ``group_size``;
    - 4-bit group-wise (``group_size`` 32 when not given): int8 values in [-8, 7] per row and
      group, symmetric (scale only) by default, affine with ``symmetric=False``
      (ExecuTorch's ``embedding_4bit`` form once packed two per byte)."""
    if bits == 8 and group_size is None:
        return TensorQuant("uint8", 0, 255, "per_channel_float_qparams", False, ch_axis=0)
    if bits == 8:
        return TensorQuant("int8", -128, 127, "per_group", symmetric is not False, ch_axis=0, group_size=group_size)
    return TensorQuant("int8", -8, 7, "per_group", symmetric is not False, ch_axis=0, group_size=group_size or 32)


#: The one row: the table of ``aten.embedding`` quantized weight-only, the lookup's output
#: float (the quantizer annotates it per node, recording its own skip reasons).
TABLE = RuleTable(
    "embedding", [Rule("embedding", modes=(Mode.WEIGHT_ONLY,), weighted=True, bias=None, notes=TIED_NOTE)]
)


def declared_capabilities(
    bits: int = 8, group_size: int | None = None, symmetric: bool | None = None
) -> tuple[Capability, ...]:
    """The one capability of an ``EmbeddingQuantizer`` with this global config
    (conformance-tested): the weight of ``aten.embedding`` (``nn.Embedding`` and
    ``F.embedding``) quantized weight-only, its output float."""
    return TABLE.capabilities(Mode.WEIGHT_ONLY, None, weight_tensor_quant(bits, group_size, symmetric))

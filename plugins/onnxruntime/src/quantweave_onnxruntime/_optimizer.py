"""The ONNX graph optimizer ``to_onnx`` runs after the exporter (public onnxscript / onnx_ir APIs).

``torch.onnx.export(..., optimize=True)`` runs onnxscript's whole optimizer: constant folding,
onnxscript's pattern rewriter (its default rules: no-op removal, pad / batch-norm into conv,
relu / clip fusions, reshape / slice / cast simplifications, ...) and clean-up passes, then its
ONNX fusions. On a Q/DQ graph the rewriter is most of the exporter's optimizer time (every rule
tried on every node, the multi-output ones walking the whole graph per node: about 2 of 2.6 CPU
seconds on a 4-layer BERT) and changed nothing on the models tests/onnxruntime and the benchmark
quantize: the float ops it simplifies are split apart by QuantizeLinear / DequantizeLinear.

:func:`optimize` with ``"fold"`` (``to_onnx``'s default) runs onnxscript's optimizer pass list
without the rewriter: functions inlined, constants folded (with ONNX shape inference), unused
nodes / functions / opsets removed (twice at most, as onnxscript does), constants lifted to
initializers, duplicate initializers and common subexpressions merged, outputs and names fixed;
``"full"`` is ``torch.onnx.export``'s own (``ONNXProgram.optimize``).
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["OPTIMIZERS", "optimize"]

#: the values of ``to_onnx(optimizer=...)``
OPTIMIZERS = ("fold", "full")


def optimize(program: Any, optimizer: Literal["fold", "full"]) -> None:
    """Optimize ``program`` (a ``torch.onnx.ONNXProgram`` exported with ``optimize=False``)
    in place."""
    if optimizer == "full":
        program.optimize()
        return
    import onnx_ir as ir
    import onnx_ir.passes.common as common
    import onnxscript.optimizer

    class FoldConstants(ir.passes.InPlacePass):
        def call(self, model: ir.Model) -> ir.passes.PassResult:
            result = onnxscript.optimizer.fold_constants(model, onnx_shape_inference=True)
            return ir.passes.PassResult(model, modified=result.modified)

    passes = ir.passes.Sequential(
        common.InlinePass(),
        ir.passes.PassManager(
            [
                FoldConstants(),
                common.RemoveUnusedNodesPass(),
                common.RemoveUnusedFunctionsPass(),
                common.RemoveUnusedOpsetsPass(),
            ],
            steps=2,
            early_stop=True,
        ),
        common.RemoveUnusedNodesPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.LiftSubgraphInitializersToMainGraphPass(),
        common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(),
        common.OutputFixPass(),
        common.NameFixPass(),
    )
    passes(program.model)

"""Helpers shared by the test modules (fixtures stay in conftest.py)."""

import torch


def export(model: torch.nn.Module, *args: torch.Tensor) -> torch.fx.GraphModule:
    """Default (non-strict) torch.export, as users call it."""
    return torch.export.export(model.eval(), args).module()


def spec_key(spec):
    """A comparable key for a PT2E spec of quantweave's or a peer's (torchao / ExecuTorch):
    ("shared", producer name(s)) for a shared spec, else its fields and observer class name."""
    if spec is None:
        return None
    if type(spec).__name__ == "SharedQuantizationSpec":
        target = spec.edge_or_node
        return ("shared", tuple(n.name for n in target) if isinstance(target, tuple) else target.name)
    ctr = spec.observer_or_fake_quant_ctr
    observer = getattr(getattr(ctr, "p", None), "func", ctr).__name__
    return (spec.dtype, spec.quant_min, spec.quant_max, spec.qscheme, spec.ch_axis, spec.is_dynamic, observer)

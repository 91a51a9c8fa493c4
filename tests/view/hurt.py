"""A small CNN with one layer made to hurt by an outlier channel: ``fc1``'s output channel 0
is scaled x100 and ``fc2``'s weight column reading it /100 (the float function is the same),
so the per-tensor int8 activation ``fc2`` reads spends its range on that one channel and the
other 31 lose their precision: ``fc2`` (node ``linear_1``) quantizes worst. Used by the view
tests and examples/view_hurt.py."""

from __future__ import annotations

import torch
from torch import nn

HURT_LAYER = "fc2"


class Hurt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc1 = nn.Linear(8 * 6 * 6, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(torch.relu(self.conv(x)), 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def hurt_model(seed: int = 0) -> Hurt:
    torch.manual_seed(seed)
    model = Hurt().eval()
    with torch.no_grad():
        model.fc1.weight[0] *= 100.0
        model.fc1.bias[0] = model.fc1.bias[0].abs() * 100.0 + 10.0  # keep the outlier alive through relu
        model.fc2.weight[:, 0] /= 100.0
    return model


def batches_for(seed: int = 0) -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(4, 3, 8, 8, generator=gen),) for _ in range(4)]


def build(seed: int = 0):
    """(ExportedProgram, its .module(), batches) for the hurt model."""
    batches = batches_for(seed)
    program = torch.export.export(hurt_model(seed), batches[0])
    return program, program.module(), batches


def quantize(float_model, batches, quantizer):
    """prepare, calibrate, convert; returns (prepared, converted)."""
    import quantweave as qw

    prepared = qw.prepare_pt2e(float_model, quantizer)
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
    return prepared, qw.convert_pt2e(prepared)


def cli_build():
    """The MODEL factory ``quantweave view tests.view.hurt:cli_build`` names: (nn.Module, batches)."""
    return hurt_model(), batches_for()

"""Where quantization hurts, looked at: a small CNN with one outlier channel, quantized by
quantweave-x86, its Model Explorer overlays written and the figures of docs/view.md drawn.

    python examples/view_outlier.py [OUT_DIR]   # needs quantweave[view,plots] and quantweave-x86

``fc1``'s output channel 0 is scaled x100 and ``fc2``'s weight column reading it /100 (the
float function is unchanged): the per-tensor int8 activation fc2 reads spends its range on
that one channel. Writes OUT_DIR (default ./view-out): the overlays (*.json) and the program
(model.pt2) for Model Explorer, and docs/images/view_*.png. ``build`` is also the model of
tests/view and of examples/view_screenshot.py (docs/view.md's Model Explorer screenshot).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

import quantweave as qw
from quantweave import view

IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc1 = nn.Linear(8 * 6 * 6, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(torch.relu(self.conv(x)), 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def build() -> tuple[nn.Module, list[tuple[torch.Tensor]]]:
    """(model, batches): the MODEL factory of ``quantweave view examples/view_outlier.py:build``."""
    torch.manual_seed(0)
    model = Net().eval()
    with torch.no_grad():  # the outlier channel
        model.fc1.weight[0] *= 100.0
        model.fc1.bias[0] = model.fc1.bias[0].abs() * 100.0 + 10.0
        model.fc2.weight[:, 0] /= 100.0
    gen = torch.Generator().manual_seed(1)
    return model, [(torch.randn(4, 3, 8, 8, generator=gen),) for _ in range(4)]


def main(out: Path) -> None:
    model, batches = build()

    program = torch.export.export(model, batches[0])  # what Model Explorer draws
    float_model = program.module()
    quantizer = qw.get_quantizer("x86")
    prepared = qw.prepare_pt2e(float_model, quantizer)
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
    converted = qw.convert_pt2e(prepared)
    numerics = qw.compare(float_model, converted, batches)
    report = qw.annotation_report(prepared, quantizer, numerics=numerics)
    print(report.to_table(worst_first=True))

    files = view.write_overlays(program, numerics, report, out)
    torch.export.save(program, str(out / "model.pt2"))
    print("overlays:", ", ".join(str(p) for p in files.values()), "and", out / "model.pt2")

    sqnr = view.plot_sqnr(numerics, program, IMAGES / "view_sqnr.png")
    weight = view.plot_observer(prepared, "linear_1", IMAGES / "view_fc2_weight.png", input_index=1)
    act = view.plot_observer(prepared, "relu_1", IMAGES / "view_fc2_input.png")

    reference = [float_model(*b) for b in batches]

    def evaluate(m: torch.nn.Module) -> float:  # higher is better: minus the output MSE against float
        with torch.no_grad():
            return -sum(float(torch.mean((m(*b) - r) ** 2)) for b, r in zip(batches, reference, strict=True))

    result = qw.fallback(float_model, qw.get_quantizer("x86"), batches, evaluate, max_drop=1e-4, max_units=3)
    print(result.summary())
    fb = view.plot_fallback(result, IMAGES / "view_fallback.png")
    for plot in (sqnr, weight, act, fb):
        print("wrote", plot.path)
    worst = min(zip(sqnr.series["op_sqnr_db"], sqnr.labels, strict=True))
    print(f"worst op: {worst[1]} at {worst[0]:.2f} dB")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("view-out"))

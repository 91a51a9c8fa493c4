"""Shared by the hosting tests (and the closing-note table): three small models, running a
vendor's quantizer through torchao's prepare_pt2e / convert_pt2e and through quantweave's,
and comparing the converted models."""

from __future__ import annotations

import copy
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import quantweave as qw


class ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(16, 16) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) / 4.0, -1)
        return self.o(weights @ self.v(x))


def _bn_stats(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 1.5)
    return model


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "conv_bn_relu": (lambda: _bn_stats(ConvBnRelu()), lambda: (torch.randn(1, 3, 12, 12),)),
    "mlp": (MLP, lambda: (torch.randn(4, 16),)),
    "attention": (Attention, lambda: (torch.randn(1, 6, 16),)),
}


_EXPORTED: dict[str, tuple[torch.fx.GraphModule, list[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]] = {}


def exported(model_name: str) -> tuple[torch.fx.GraphModule, list[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]:
    """The model exported (``.module(check_guards=False)``: Arm's and Cortex-M's passes reject
    the guard call), four calibration batches and a test input; seeded. Exported once per
    process: each call returns its own deep copy of the graph module (prepare_pt2e folds batch
    norms and inserts observers in place), so torchao's and quantweave's runs start from the
    same graph and parameters, as they did when each exported afresh."""
    if model_name not in _EXPORTED:
        make_model, make_input = MODELS[model_name]
        torch.manual_seed(0)
        model = make_model().eval()
        batches = [make_input() for _ in range(4)]
        test = make_input()
        _EXPORTED[model_name] = (torch.export.export(model, batches[0]).module(check_guards=False), batches, test)
    gm, batches, test = _EXPORTED[model_name]
    return copy.deepcopy(gm), list(batches), test


QDQ = ("quantize_", "dequantize_")


def qdq_count(gm: torch.fx.GraphModule) -> int:
    return sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_function" and str(getattr(n.target, "__name__", n.target)).startswith(QDQ)
    )


def _quiet() -> Any:
    logging.disable(logging.WARNING)
    return warnings.catch_warnings()


def run_torchao(build: Callable[[], Any], model_name: str) -> torch.fx.GraphModule:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    gm, batches, _ = exported(model_name)
    with _quiet():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(gm, build())
        for batch in batches:
            prepared(*batch)
        return convert_pt2e(prepared)


def run_quantweave(quantizer: Any, model_name: str) -> torch.fx.GraphModule:
    gm, batches, _ = exported(model_name)
    with _quiet():
        warnings.simplefilter("ignore")
        prepared = qw.prepare_pt2e(gm, quantizer)
        for batch in batches:
            prepared(*batch)
        return qw.convert_pt2e(prepared)


@dataclass
class Parity:
    vendor: str
    model: str
    torchao_qdq: int
    quantweave_qdq: int
    max_diff: float
    seconds: float


def parity(name: str, build: Callable[[], Any], quantizer: Any, model_name: str) -> Parity:
    start = time.perf_counter()
    reference = run_torchao(build, model_name)
    ours = run_quantweave(quantizer, model_name)
    test = _EXPORTED[model_name][2]
    with torch.no_grad():
        diff = (reference(*test) - ours(*test)).abs().max().item()
    return Parity(name, model_name, qdq_count(reference), qdq_count(ours), diff, time.perf_counter() - start)

"""Real data for accuracy tests and benchmarks: scikit-learn's handwritten digits.

The dataset (1797 grey 8x8 images of the digits 0-9, from UCI's optical recognition set)
ships inside the scikit-learn wheel (``sklearn/datasets/data/digits.csv.gz``), so loading it
needs no download, and three small models train on it in seconds on a CPU:

- :class:`DigitsCNN`: three conv + batch norm + relu blocks, a max pool, global average
  pool and a linear head (the conv patterns every plugin quantizes, and conv + batch norm
  for QAT);
- :class:`DigitsMLP`: linear + relu layers on the flattened image;
- :class:`DigitsAttention`: the eight image rows as eight tokens, a linear embedding, one
  pre-norm transformer encoder block (:class:`quantweave.testing.models.EncoderBlock`) and
  a linear head.

scikit-learn is a test / benchmark dependency only: it is imported when the data is first
loaded, never by ``import quantweave`` or ``import quantweave.testing.digits``.

Everything is deterministic for a given seed: the split is a fixed permutation, training
shuffles with its own generator and runs on one thread (2-core machines loaded by other
work make multi-threaded training of tiny models an order of magnitude slower, and one
thread makes the float sums reproducible).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from .models import EncoderBlock

__all__ = [
    "DigitsAttention",
    "DigitsCNN",
    "DigitsData",
    "DigitsMLP",
    "MODELS",
    "QAT_BATCH",
    "accuracy",
    "batches",
    "calibrate",
    "export_digits",
    "load_digits_data",
    "make_outlier_channel",
    "quantize_ptq",
    "quantize_qat",
    "single_thread",
    "train",
    "trained_model",
]

#: Images held out for testing (20 % of 1797); one image is 1/360 = 0.28 accuracy points.
TEST_SIZE = 360


@dataclass(frozen=True)
class DigitsData:
    """Images as float32 ``[N, 1, 8, 8]`` in [0, 1] (pixel / 16), labels as int64 ``[N]``."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


@functools.cache
def load_digits_data(seed: int = 0, test_size: int = TEST_SIZE) -> DigitsData:
    """scikit-learn's digits, split by a permutation drawn from ``seed``: ``test_size``
    images for testing, the rest (1437 by default) for training and calibration."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "quantweave.testing.digits needs scikit-learn (the digits data ships in its wheel): "
            "pip install scikit-learn"
        ) from exc
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    test, train_ = perm[:test_size], perm[test_size:]
    return DigitsData(images[train_], labels[train_], images[test], labels[test])


# -- models ------------------------------------------------------------------------------------


class DigitsCNN(nn.Module):
    """conv-bn-relu x2, max pool, conv-bn-relu, global average pool, linear."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
        self.bn3 = nn.BatchNorm2d(2 * width)
        self.relu3 = nn.ReLU()
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.pool(self.relu2(self.bn2(self.conv2(x))))
        x = self.relu3(self.bn3(self.conv3(x)))
        return self.fc(torch.flatten(self.gap(x), 1))


class DigitsMLP(nn.Module):
    """64 pixels -> 128 -> 64 -> 10, relu between."""

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden // 2)
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(hidden // 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.fc1(torch.flatten(x, 1)))
        return self.fc3(self.relu2(self.fc2(x)))


class DigitsAttention(nn.Module):
    """The 8 image rows as 8 tokens: linear embedding + learned positions, one encoder
    block (self-attention with explicit matmuls and softmax, gelu MLP), mean over tokens,
    layer norm, linear head."""

    def __init__(self, d_model: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d_model)
        self.pos = nn.Parameter(torch.zeros(8, d_model))
        self.block = EncoderBlock(d_model, heads, 2 * d_model)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x.flatten(1, 2)) + self.pos  # [N, 1, 8, 8] -> [N, 8 rows, 8]
        return self.head(self.norm(self.block(tokens).mean(dim=1)))


#: name -> (constructor, training hyper-parameters: epochs, learning rate)
MODELS: dict[str, tuple[Callable[[], nn.Module], int, float]] = {
    "cnn": (DigitsCNN, 12, 3e-3),
    "mlp": (DigitsMLP, 30, 2e-3),
    "attention": (DigitsAttention, 40, 3e-3),
}


# -- training and evaluation -------------------------------------------------------------------


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread inside the block (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def batches(x: torch.Tensor, size: int) -> list[torch.Tensor]:
    """``x`` in consecutive batches of ``size`` (the last may be smaller)."""
    return [x[i : i + size] for i in range(0, len(x), size)]


def train(
    model: nn.Module,
    data: DigitsData,
    epochs: int,
    lr: float,
    seed: int = 0,
    batch_size: int = 64,
    step: Callable[[torch.Tensor], torch.Tensor] | None = None,
    parameters: Sequence[torch.Tensor] | None = None,
) -> None:
    """Adam on cross-entropy, ``epochs`` passes over the training images in batches of
    ``batch_size`` (a partial last batch is dropped, so an exported model with a fixed
    batch size trains too), shuffled by a generator seeded with ``seed`` and the epoch.

    ``step`` is the forward function (default ``model``); ``parameters`` what is trained
    (default ``model.parameters()``). Puts ``model`` in training mode only when ``step``
    is not given (an exported model's mode is switched with
    :func:`quantweave.move_exported_model_to_train`)."""
    forward = step if step is not None else model
    if step is None:
        model.train()
    params = list(parameters) if parameters is not None else list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=lr)
    n = len(data.train_x)
    with single_thread():
        for epoch in range(epochs):
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
            for start in range(0, n - batch_size + 1, batch_size):
                index = order[start : start + batch_size]
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(forward(data.train_x[index]), data.train_y[index])
                loss.backward()
                optimizer.step()
    if step is None:
        model.eval()


def accuracy(
    model: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None
) -> float:
    """Top-1 accuracy in percent (0-100) of ``model`` on ``x``, ``y``.

    ``batch_size``: for a model exported with a fixed batch size, every batch is run at
    that size (the last one padded with zero images whose predictions are dropped)."""
    predictions = []
    with torch.no_grad(), single_thread():
        for b in batches(x, batch_size or 512):
            n = len(b)
            if batch_size is not None and n < batch_size:
                b = torch.cat([b, b.new_zeros((batch_size - n, *b.shape[1:]))])
            predictions.append(model(b)[:n].argmax(dim=1))
    return 100.0 * float((torch.cat(predictions) == y).float().mean())


def trained_model(name: str, seed: int = 0, data: DigitsData | None = None) -> nn.Module:
    """A :data:`MODELS` model trained on the digits (eval mode); deterministic for ``seed``."""
    if name not in MODELS:
        raise ValueError(f"unknown digits model {name!r}; known: {sorted(MODELS)}")
    factory, epochs, lr = MODELS[name]
    torch.manual_seed(seed)
    model = factory()
    train(model, data or load_digits_data(), epochs=epochs, lr=lr, seed=seed)
    return model


#: the fixed batch size of QAT exports (``prepare_qat_pt2e`` needs static shapes: its conv +
#: batch norm rewrite computes shapes with concrete sizes)
QAT_BATCH = 64


def export_digits(model: nn.Module, training: bool = False, batch_size: int | None = None) -> GraphModule:
    """``torch.export`` of a digits model, in eval mode or (``training=True``) training mode
    (for QAT). Without ``batch_size`` the batch dimension is dynamic (calibrate and evaluate
    with any batch size); with it, the export takes exactly that many images."""
    model = model.train() if training else model.eval()
    example = (torch.zeros(batch_size or 4, 1, 8, 8),)
    dynamic = None if batch_size is not None else ({0: torch.export.Dim("batch", min=2)},)
    exported = torch.export.export(model, example, dynamic_shapes=dynamic).module()
    assert isinstance(exported, GraphModule)
    return exported


def calibrate(prepared: Callable[[torch.Tensor], Any], x: torch.Tensor, batch_size: int = 256) -> None:
    """Run ``x`` through a prepared model in batches of ``batch_size``."""
    with torch.no_grad(), single_thread():
        for b in batches(x, batch_size):
            prepared(b)


def quantize_ptq(model: nn.Module | GraphModule, quantizer: Any, data: DigitsData | None = None) -> GraphModule:
    """Export (unless ``model`` already is an exported GraphModule), prepare with
    ``quantizer``, calibrate on every training image, convert."""
    import quantweave as qw

    data = data or load_digits_data()
    exported = model if isinstance(model, GraphModule) else export_digits(model)
    prepared = qw.prepare_pt2e(exported, quantizer)
    calibrate(prepared, data.train_x)
    return qw.convert_pt2e(prepared)


def quantize_qat(
    model: nn.Module,
    quantizer: Any,
    data: DigitsData | None = None,
    epochs: int = 3,
    lr: float = 1e-4,
    seed: int = 0,
) -> GraphModule:
    """QAT from a trained float model: export in training mode with a batch of
    :data:`QAT_BATCH` images, ``prepare_qat_pt2e``, ``epochs`` of fine-tuning at ``lr``
    (Adam; batch norm keeps training), switch to eval, convert. Evaluate the result with
    ``accuracy(..., batch_size=QAT_BATCH)``."""
    import quantweave as qw

    data = data or load_digits_data()
    exported = export_digits(copy.deepcopy(model), training=True, batch_size=QAT_BATCH)
    prepared = qw.prepare_qat_pt2e(exported, quantizer)
    torch.manual_seed(seed)
    train(
        prepared,
        data,
        epochs=epochs,
        lr=lr,
        seed=seed,
        batch_size=QAT_BATCH,
        step=prepared,
        parameters=list(prepared.parameters()),
    )
    qw.move_exported_model_to_eval(prepared)
    return qw.convert_pt2e(prepared)


def make_outlier_channel(model: DigitsCNN, channel: int = 0, factor: float = 1000.0) -> DigitsCNN:
    """A copy of a trained :class:`DigitsCNN` whose ``conv2`` reads a quantization-hostile
    input, with the same float function: batch norm 1 scales its output ``channel`` by
    ``factor`` (so relu 1's output, conv2's input, has one channel ``factor`` times larger
    than the others: a per-tensor activation scale then flattens every other channel) and
    conv2's weights for that input channel are divided by ``factor`` (relu is positively
    homogeneous, so the float outputs do not change beyond rounding)."""
    if not isinstance(model, DigitsCNN):
        raise TypeError(f"make_outlier_channel expects a DigitsCNN; got {type(model).__name__}")
    hostile = copy.deepcopy(model).eval()
    with torch.no_grad():
        hostile.bn1.weight[channel] *= factor
        hostile.bn1.bias[channel] *= factor
        hostile.conv2.weight[:, channel] /= factor
    return hostile

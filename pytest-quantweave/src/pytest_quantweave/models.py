"""Reference models built in-project (torchvision cannot be installed beside torch 2.13).

Every factory is deterministic (``seed``), returns a model in eval mode and matching
example inputs via :func:`example_inputs`. Shapes are small by default so tests stay fast;
benchmarks pass larger sizes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

__all__ = [
    "BasicBlock",
    "ConvTransposeDecoder",
    "EncoderBlock",
    "InvertedResidual",
    "MobileNetLike",
    "MobileNetV2Like",
    "ResNetLike",
    "SmallLM",
    "calibration_batches",
    "conv_transpose_decoder",
    "example_inputs",
    "mobilenet_v2_like",
    "resnet18_like",
    "DecoderBlock",
    "TinyDecoderLM",
    "lm_prompts",
    "tiny_decoder_lm",
]


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        # two ReLU modules, not one called twice: torchao's x86 quantizer (matching by source
        # partitions) fails on a reused module ("Input partition has more than one output node")
        self.relu1 = nn.ReLU()
        self.relu2 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + identity)


class ResNetLike(nn.Module):
    """ResNet-18 topology (``blocks=(2, 2, 2, 2)``, ``width=64``) or smaller variants.

    ``depth_multiplier`` repeats each stage's blocks, for graph-size scaling benchmarks.
    """

    def __init__(
        self,
        blocks: tuple[int, ...] = (2, 2, 2, 2),
        width: int = 64,
        num_classes: int = 1000,
        depth_multiplier: int = 1,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        layers: list[nn.Module] = []
        cin = width
        for i, n in enumerate(blocks):
            cout = width * 2**i
            for j in range(n * depth_multiplier):
                layers.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def resnet18_like(seed: int = 0, **kwargs: object) -> ResNetLike:
    torch.manual_seed(seed)
    model = ResNetLike(**kwargs)  # type: ignore[arg-type]
    _randomize_bn(model)
    return model.eval()


class MobileNetLike(nn.Module):
    """Depthwise-separable blocks with hardswish and a squeeze-excite sigmoid gate."""

    def __init__(self, width: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.Hardswish())
        self.dw = nn.Sequential(
            nn.Conv2d(width, width, 3, 1, 1, groups=width, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.se_reduce = nn.Conv2d(width, width // 4, 1)
        self.se_expand = nn.Conv2d(width // 4, width, 1)
        self.pw = nn.Sequential(nn.Conv2d(width, 2 * width, 1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dw(self.stem(x))
        gate = torch.sigmoid(self.se_expand(torch.relu(self.se_reduce(self.pool(x)))))
        x = self.pw(x * gate)
        return self.fc(torch.flatten(self.pool(x), 1))


class EncoderBlock(nn.Module):
    """A pre-norm transformer encoder block written with explicit matmuls."""

    def __init__(self, d_model: int = 64, heads: int = 4, ff: int = 256) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, ff)
        self.ff2 = nn.Linear(ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q = q.reshape(b, s, h, d // h).transpose(1, 2)
        k = k.reshape(b, s, h, d // h).transpose(1, 2)
        v = v.reshape(b, s, h, d // h).transpose(1, 2)
        attn = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // h), dim=-1)
        y = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.ff2(torch.nn.functional.gelu(self.ff1(self.norm2(x))))


def encoder_block(seed: int = 0, **kwargs: int) -> EncoderBlock:
    torch.manual_seed(seed)
    return EncoderBlock(**kwargs).eval()


class SmallLM(nn.Module):
    """Token embedding, a stack of encoder blocks, and a linear LM head."""

    def __init__(self, vocab: int = 256, d_model: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.Sequential(*[EncoderBlock(d_model, heads, 4 * d_model) for _ in range(layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(tokens))))


def _randomize_bn(model: nn.Module) -> None:
    """Give BN layers non-trivial statistics, as a trained model has."""
    gen = torch.Generator().manual_seed(1234)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            assert m.running_mean is not None and m.running_var is not None
            m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
            with torch.no_grad():
                m.weight.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.1)


def example_inputs(model: nn.Module, batch: int = 1, image: int = 32, seq: int = 16) -> tuple[torch.Tensor, ...]:
    """Example inputs of the right kind for each reference model."""
    gen = torch.Generator().manual_seed(7)
    if isinstance(model, SmallLM):
        return (torch.randint(0, model.embed.num_embeddings, (batch, seq), generator=gen),)
    if isinstance(model, EncoderBlock):
        return (torch.randn(batch, seq, model.qkv.in_features, generator=gen),)
    return (torch.randn(batch, 3, image, image, generator=gen),)


def calibration_batches(
    model: nn.Module, count: int, batch: int = 1, image: int = 32, seq: int = 16
) -> list[tuple[torch.Tensor, ...]]:
    """``count`` deterministic calibration batches for ``model``."""
    gen = torch.Generator().manual_seed(99)
    out: list[tuple[torch.Tensor, ...]] = []
    for _ in range(count):
        if isinstance(model, SmallLM):
            out.append((torch.randint(0, model.embed.num_embeddings, (batch, seq), generator=gen),))
        elif isinstance(model, EncoderBlock):
            out.append((torch.randn(batch, seq, model.qkv.in_features, generator=gen),))
        else:
            out.append((torch.randn(batch, 3, image, image, generator=gen),))
    return out


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise, 1x1 project (+ residual add)."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.expand = nn.Sequential(nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardtanh(0, 6))
        self.dw = nn.Sequential(
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.Hardtanh(0, 6),
        )
        self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.dw(self.expand(x)))
        return x + y if self.residual else y


class MobileNetV2Like(nn.Module):
    """MobileNetV2 topology at small width: depthwise convs, hardtanh(0, 6) (ReLU6 written as
    the op XNNPACK clamps), residual adds, adaptive average pooling and a linear head."""

    def __init__(self, width: int = 16, num_classes: int = 10, stages: tuple[int, ...] = (1, 2, 2)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.Hardtanh(0, 6))
        blocks: list[nn.Module] = []
        cin = width
        for i, repeats in enumerate(stages):
            cout = width * (i + 1)
            for j in range(repeats):
                blocks.append(InvertedResidual(cin, cout, 2 if (j == 0 and i > 0) else 1, expand=1 if i == 0 else 4))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Conv2d(cin, 4 * cin, 1, bias=False), nn.BatchNorm2d(4 * cin), nn.Hardtanh(0, 6))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.head(self.blocks(self.stem(x))))
        return self.fc(torch.flatten(x, 1))


def mobilenet_v2_like(seed: int = 0, **kwargs: object) -> MobileNetV2Like:
    torch.manual_seed(seed)
    model = MobileNetV2Like(**kwargs)  # type: ignore[arg-type]
    _randomize_bn(model)
    return model.eval()


class ConvTransposeDecoder(nn.Module):
    """A small encoder-decoder (segmentation / autoencoder style): strided convs down,
    transposed convs (+ batch norm when ``bn``) + relu up, a 1x1 conv head."""

    def __init__(self, width: int = 16, out_channels: int = 3, bn: bool = True) -> None:
        super().__init__()

        def norm(c: int) -> nn.Module:
            return nn.BatchNorm2d(c) if bn else nn.Identity()

        self.down = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, 2, 1),
            nn.ReLU(),
        )
        self.up = nn.Sequential(
            nn.ConvTranspose2d(2 * width, width, 4, 2, 1),
            norm(width),
            nn.ReLU(),
            nn.ConvTranspose2d(width, width, 4, 2, 1),
            norm(width),
            nn.ReLU(),
        )
        self.head = nn.Conv2d(width, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.up(self.down(x)))


def conv_transpose_decoder(seed: int = 0, **kwargs: object) -> ConvTransposeDecoder:
    torch.manual_seed(seed)
    model = ConvTransposeDecoder(**kwargs)  # type: ignore[arg-type]
    _randomize_bn(model)
    return model.eval()


# -- a decoder-only language model (issue 11: embeddings + XNNPACK on ExecuTorch) ------------------


class DecoderBlock(nn.Module):
    """Pre-norm causal self-attention and a GELU MLP, each with a residual add."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (y.reshape(b, t, h, d // h).transpose(1, 2) for y in (q, k, v))
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d // h)) + mask[:t, :t]
        x = x + self.proj((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class TinyDecoderLM(nn.Module):
    """Decoder-only LM: token embedding + learned position embedding, ``layers`` causal
    decoder blocks, a final layer norm and a bias-free LM head (``tied``: the head's weight
    *is* the token table). No KV cache: ``forward(tokens)`` returns the logits of every
    position of a window of up to ``max_seq`` tokens."""

    mask: torch.Tensor
    positions: torch.Tensor

    def __init__(
        self, vocab: int = 32000, dim: int = 128, layers: int = 2, heads: int = 4, max_seq: int = 64, tied: bool = False
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_seq, dim)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads, 4 * dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.head.weight = self.tok.weight
        self.register_buffer("mask", torch.full((max_seq, max_seq), float("-inf")).triu(1), persistent=False)
        self.register_buffer("positions", torch.arange(max_seq), persistent=False)

    @property
    def tied(self) -> bool:
        return self.head.weight is self.tok.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(self.positions[: tokens.shape[1]])
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.norm(x))


def tiny_decoder_lm(seed: int = 0, **kwargs: Any) -> TinyDecoderLM:
    """A deterministic :class:`TinyDecoderLM` in eval mode (PyTorch's default inits under
    ``torch.manual_seed(seed)``). Defaults (vocab 32000, dim 128, 2 layers, 4 heads, 64
    positions): 8,596,992 parameters untied (two 4,096,000-element tables: token embedding
    and head), 4,500,992 tied."""
    torch.manual_seed(seed)
    return TinyDecoderLM(**kwargs).eval()


def lm_prompts(model: TinyDecoderLM, count: int = 8, seq: int | None = None, seed: int = 11) -> torch.Tensor:
    """``count`` deterministic prompts (token ids) of ``seq`` tokens (default: the model's
    window), as one ``(count, seq)`` batch."""
    gen = torch.Generator().manual_seed(seed)
    length = model.pos.num_embeddings if seq is None else seq
    return torch.randint(0, model.tok.num_embeddings, (count, length), generator=gen)

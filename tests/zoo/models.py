"""The zoo's architectures: ``transformers`` configs with random initialisation, small sizes.

Each builder returns ``(model, example_inputs, calibration_batches)``: a float model in eval
mode whose forward returns one tensor (the architecture's last hidden state, or a causal
LM's logits), the inputs it is exported with, and a few batches of the same shape.
Batch norms get their running statistics from a few train-mode passes on a copy of the
model (random-init statistics, mean 0 and variance 1, make deep activations vanish).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

IMAGE = 32  #: image side (vision models)
SEQ = 16  #: tokens (language models)
VOCAB = 128
CALIBRATION = 4  #: calibration batches


@dataclass(frozen=True)
class ZooModel:
    name: str
    kind: str  #: "vision", "language" or "speech"
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    calibration: tuple[tuple[torch.Tensor, ...], ...]


class _Output(nn.Module):
    """One tensor out of a transformers model: ``field`` of its output."""

    def __init__(self, model: nn.Module, field: str) -> None:
        super().__init__()
        self.model = model
        self.field = field

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(x), self.field)


def _with_bn_statistics(model: nn.Module, batches: list[torch.Tensor]) -> nn.Module:
    """A copy of ``model`` whose batch norms' running statistics come from train-mode passes
    over ``batches`` (the model given is not changed). Their affine weights start at 1 and
    biases at 0, as torchvision initialises them (transformers draws EfficientNet's from
    N(0, 0.02), which makes its activations vanish too)."""
    model = copy.deepcopy(model)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        for m in norms:
            m.reset_parameters()
            m.momentum = None  # cumulative average
        model.train()
        with torch.no_grad():
            for x in batches:
                model(x)
    return model.eval()


def _images(n: int, batch: int = 2) -> list[torch.Tensor]:
    return [torch.randn(batch, 3, IMAGE, IMAGE) for _ in range(n)]


def _tokens(n: int) -> list[torch.Tensor]:
    return [torch.randint(0, VOCAB, (1, SEQ)) for _ in range(n)]


def _vision(name: str, model: nn.Module, field: str = "last_hidden_state") -> ZooModel:
    model = _with_bn_statistics(_Output(model, field), _images(4, batch=8))
    inputs = (torch.randn(1, 3, IMAGE, IMAGE),)
    return ZooModel(name, "vision", model, inputs, tuple((x[:1],) for x in _images(CALIBRATION)))


def _language(name: str, model: nn.Module, field: str) -> ZooModel:
    model = _Output(model, field).eval()
    batches = _tokens(CALIBRATION + 1)
    return ZooModel(name, "language", model, (batches[0],), tuple((x,) for x in batches[1:]))


def resnet() -> ZooModel:
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
    return _vision("resnet", ResNetModel(config))


#: MobileNetV2's inverted-residual blocks kept (of its 16): the first (stride 2), the first
#: residual one (stride 1, same channels) and every one that changes the channels (stride 2 or
#: 1); the others repeat these. With ``depth_multiplier=0.25`` their channels are 8 -> 8 (s2),
#: 8 -> 8 (residual), 8 -> 16 (s2), 16 -> 24, 24 -> 40 (s2), 40 -> 80.
MOBILENET_V2_BLOCKS = (0, 1, 5, 9, 12, 15)


def mobilenet_v2() -> ZooModel:
    from transformers import MobileNetV2Config, MobileNetV2Model

    config = MobileNetV2Config(image_size=IMAGE, depth_multiplier=0.25, min_depth=4, finegrained_output=False)
    model = MobileNetV2Model(config, add_pooling_layer=False)
    model.layer = nn.ModuleList(model.layer[i] for i in MOBILENET_V2_BLOCKS)
    return _vision("mobilenet_v2", model)


def efficientnet() -> ZooModel:
    from transformers import EfficientNetConfig, EfficientNetModel

    # the first three of EfficientNet-B0's seven stages (expansion 1 then 6, kernels 3 and 5, strides 1 and 2),
    # the second repeated once: a block with the residual connection (the first block of a stage has none)
    config = EfficientNetConfig(
        image_size=IMAGE,
        width_coefficient=0.25,
        depth_coefficient=1.0,
        kernel_sizes=[3, 3, 5],
        in_channels=[32, 16, 24],
        out_channels=[16, 24, 40],
        strides=[1, 2, 2],
        num_block_repeats=[1, 2, 1],
        expand_ratios=[1, 6, 6],
        hidden_dim=320,
    )
    return _vision("efficientnet", EfficientNetModel(config))


def convnext() -> ZooModel:
    from transformers import ConvNextConfig, ConvNextModel

    config = ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=IMAGE)
    return _vision("convnext", ConvNextModel(config))


def regnet() -> ZooModel:
    from transformers import RegNetConfig, RegNetModel

    config = RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8)
    return _vision("regnet", RegNetModel(config))


def vit() -> ZooModel:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        image_size=IMAGE,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    return _vision("vit", ViTModel(config, add_pooling_layer=False))


def swin() -> ZooModel:
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(image_size=IMAGE, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)
    return _vision("swin", SwinModel(config, add_pooling_layer=False))


def bert() -> ZooModel:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return _language("bert", BertModel(config, add_pooling_layer=False), "last_hidden_state")


def distilbert() -> ZooModel:
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=1, n_heads=2, hidden_dim=64, max_position_embeddings=64
    )
    return _language("distilbert", DistilBertModel(config), "last_hidden_state")


def gpt2() -> ZooModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    return _language("gpt2", GPT2LMHeadModel(config), "logits")


#: the decoder size Llama and Qwen2 share (grouped-query attention: 2 heads, 1 key/value head)
DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
)


def llama() -> ZooModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**DECODER)
    return _language("llama", LlamaForCausalLM(config), "logits")


def qwen2() -> ZooModel:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**DECODER)
    return _language("qwen2", Qwen2ForCausalLM(config), "logits")


def whisper_encoder() -> ZooModel:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    mels, positions = 16, 16
    config = WhisperConfig(
        num_mel_bins=mels,
        d_model=32,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        max_source_positions=positions,
    )
    model = _Output(WhisperEncoder(config), "last_hidden_state").eval()
    batches = [torch.randn(1, mels, 2 * positions) for _ in range(CALIBRATION + 1)]
    return ZooModel("whisper_encoder", "speech", model, (batches[0],), tuple((x,) for x in batches[1:]))


BUILDERS: dict[str, Callable[[], ZooModel]] = {
    f.__name__: f
    for f in (
        resnet,
        mobilenet_v2,
        efficientnet,
        convnext,
        regnet,
        vit,
        swin,
        bert,
        gpt2,
        llama,
        qwen2,
        distilbert,
        whisper_encoder,
    )
}

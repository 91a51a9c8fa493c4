"""Models written as the libraries users quantize write them (no torchvision / transformers
needed): torchvision's in-place residual block, transformers' GPT-2 ``Conv1D`` (an addmm of a
weight stored [in, out]) and a hand-written ``x @ W + b``."""

import torch
from torch import nn


class BasicBlock(nn.Module):
    """torchvision's BasicBlock, as it writes it (``nn.ReLU(inplace=True)``, ``out += identity``)."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = self.relu(self.stem(x))
        out = self.relu(self.conv1(identity))
        out = self.conv2(out)
        out += identity
        return self.relu(out)


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D: weight stored [in, out], computed with addmm."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        size_out = (*x.size()[:-1], self.weight.size(-1))
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class Mlp(nn.Module):
    """GPT-2's MLP (two Conv1D) and a hand-written ``x @ W + b`` head."""

    def __init__(self):
        super().__init__()
        self.c_fc = Conv1D(32, 16)
        self.c_proj = Conv1D(16, 32)
        self.w = nn.Parameter(torch.randn(16, 8) * 0.1)
        self.b = nn.Parameter(torch.randn(8) * 0.1)

    def forward(self, x):
        return torch.relu(self.c_proj(torch.relu(self.c_fc(x)))) @ self.w + self.b


class TinyGPT(nn.Module):
    """A GPT-2-shaped block on Conv1D: token embedding, attention (c_attn, c_proj), a tied-free
    ``h @ W`` head."""

    def __init__(self, vocab=64, d=16):
        super().__init__()
        self.d = d
        self.wte = nn.Embedding(vocab, d)
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)
        self.mlp = Mlp()
        self.head = nn.Parameter(torch.randn(8, vocab) * 0.1)

    def forward(self, ids):
        h = self.wte(ids)
        q, k, v = self.c_attn(h).split(self.d, dim=-1)
        a = torch.softmax(q @ k.transpose(-1, -2) / 4, -1) @ v
        h = h + self.c_proj(a)
        return self.mlp(h) @ self.head

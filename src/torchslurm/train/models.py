"""The examples' models: SimpleConvNet (MNIST 28×28, plus an 8×8 variant for digits),
SimpleModel (10→50→2) and GPT (a small byte-level language model)."""

from __future__ import annotations

import math

import torch
from torch import nn

from torchslurm.errors import ConfigError, not_one_of


class SimpleConvNet(nn.Module):
    """Two 3×3 convolutions, max-pool, dropout, two linear layers: the classic MNIST net of PyTorch's DDP examples.

    `image_size=28` is the seed's MNIST model (valid convolutions, 9216 features). Small images
    (the 8×8 digits) use padded convolutions so the feature map survives: `SimpleConvNet(8)`.
    """

    def __init__(self, image_size: int = 28, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        if image_size < 4:
            raise ConfigError(
                f"SimpleConvNet image_size={image_size}, expected at least 4 pixels.",
                "use image_size=8 for digits or 28 for MNIST."
            )
        padding = 1 if image_size < 16 else 0
        side = (image_size - 4 + 4 * padding) // 2
        self.conv1 = nn.Conv2d(in_channels, 32, 3, padding=padding)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=padding)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * side * side, 128)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = self.dropout1(torch.max_pool2d(x, 2))
        x = self.dropout2(torch.relu(self.fc1(torch.flatten(x, 1))))
        logits: torch.Tensor = self.fc2(x)  # CrossEntropyLoss applies the log-softmax
        return logits


class SimpleModel(nn.Module):
    """The toy DDP model: 10 inputs → 50 hidden (ReLU) → 2 outputs."""

    def __init__(self, in_features: int = 10, hidden: int = 50, out_features: int = 2) -> None:
        super().__init__()
        self.net1 = nn.Linear(in_features, hidden)
        self.net2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net2(torch.relu(self.net1(x)))
        return out


def build(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The model called `name` (convnet | simple | resnet18 | gpt) for inputs of `input_shape`
    (gpt: (block_size,), and `num_classes` is its vocabulary)."""
    if name == "convnet":
        if len(input_shape) != 3:
            raise ConfigError(f"model=convnet needs (channels, height, width) images, got inputs of shape "
                              f"{input_shape}.",
                              "use model=simple for flat features.")
        return SimpleConvNet(input_shape[-1], num_classes, in_channels=input_shape[0])
    if name == "simple":
        return nn.Sequential(nn.Flatten(), SimpleModel(math.prod(input_shape), 50, num_classes))
    if name == "resnet18":
        try:
            from torchvision.models import resnet18
        except ImportError as exc:
            raise ConfigError("model=resnet18 needs torchvision, which is not installed.",
                              "pip install torchvision (the build matching your torch), or use model=convnet.") from exc
        resnet: nn.Module = resnet18(num_classes=num_classes)
        return resnet
    if name == "gpt":
        if len(input_shape) != 1:
            raise ConfigError(f"model=gpt needs token sequences, got inputs of shape {input_shape}.",
                              "use it with dataset=text.")
        return GPT(vocab=num_classes, block_size=input_shape[0])
    raise not_one_of("model", name, ("convnet", "simple", "resnet18", "gpt"))


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention, then an MLP, each with a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))
        return out


class GPT(nn.Module):
    """A small decoder-only transformer language model: token and position embeddings, `layers`
    Blocks, a final LayerNorm and an (untied) output head giving (N, T, vocab) logits."""

    def __init__(self, vocab: int = 256, block_size: int = 64, dim: int = 64, layers: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        if dim % heads:
            raise ConfigError(f"GPT dim={dim} is not a multiple of heads={heads}.", "e.g. dim=64, heads=4.")
        self.block_size, self.dim, self.layers = block_size, dim, layers
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block_size, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits

    def flops_per_token(self) -> float:
        """Training FLOPs per token, estimated: 6 per weight (forward 2, backward 4) plus attention's
        12·layers·dim·block_size."""
        weights = sum(p.numel() for p in self.parameters()) - self.pos.weight.numel()
        return 6.0 * weights + 12.0 * self.layers * self.dim * self.block_size

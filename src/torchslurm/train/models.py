"""The examples' models: SimpleConvNet (MNIST 28×28, plus an 8×8 variant for digits) and
SimpleModel (10→50→2)."""

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
    """The model called `name` (convnet | simple | resnet18) for inputs of `input_shape`."""
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
    raise not_one_of("model", name, ("convnet", "simple", "resnet18"))

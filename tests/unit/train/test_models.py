import pytest
import torch

from torchslurm.errors import ConfigError
from torchslurm.train.models import GPT, Block, SimpleConvNet, SimpleModel


@pytest.mark.parametrize("size", [28, 8])
def test_convnet_maps_images_to_ten_logits(size: int) -> None:
    assert SimpleConvNet(size)(torch.zeros(3, 1, size, size)).shape == (3, 10)


def test_convnet_28_is_the_seed_model() -> None:
    assert SimpleConvNet(28).fc1.in_features == 9216  # 64 × 12 × 12, as in the classic MNIST net


def test_convnet_rejects_tiny_images() -> None:
    with pytest.raises(ConfigError, match=r"image_size=2, expected at least 4 .*HINT: use image_size=8"):
        SimpleConvNet(2)


def test_simple_model_is_10_50_2() -> None:
    model = SimpleModel()
    assert (model.net1.in_features, model.net1.out_features, model.net2.out_features) == (10, 50, 2)
    assert model(torch.zeros(4, 10)).shape == (4, 2)


def test_gpt_logits_shape_and_flops() -> None:
    model = GPT(block_size=8, dim=16, layers=1, heads=2)
    assert model(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 8, 256)
    assert model.flops_per_token() > 6 * sum(p.numel() for p in Block(16, 2).parameters())

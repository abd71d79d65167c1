"""FSDP2's pure parts: which modules become units, the mixed-precision policy, the optimizer rebound."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchslurm.errors import ConfigError
from torchslurm.train import fsdp
from torchslurm.train.config import TrainConfig
from torchslurm.train.models import GPT
from torchslurm.train.strategy import make_scaler


def test_units_by_share_look_into_module_lists() -> None:
    model = GPT(layers=3, dim=32, heads=2)
    chosen = fsdp.units(model, min_share=0.1)
    assert [type(m).__name__ for m in chosen] == ["Embedding", "Block", "Block", "Block", "Linear"]
    assert model.ln_f not in chosen and model.pos not in chosen


class Tagger(nn.Module):
    """Token embedding, torch's own nn.TransformerEncoder of `layers` layers, a small head."""

    def __init__(self, layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(128, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(32), enable_nested_tensor=False)
        self.head = nn.Linear(32, 5)


def test_a_transformer_encoder_is_sharded_per_layer_without_fsdp_wrap() -> None:
    """Its `layers` ModuleList is looked into, so every layer is a unit however small its share (12
    layers: 7 % each) and the encoder's final norm goes with the root."""
    model = Tagger(layers=12)
    chosen = fsdp.units(model)
    assert chosen == list(model.encoder.layers)
    small = Tagger(layers=3)
    assert fsdp.units(small) == [small.embed, *small.encoder.layers]  # the embedding holds 10 % or more
    whole = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=3, dim_feedforward=32,
                           batch_first=True)
    assert [type(m).__name__ for m in fsdp.units(whole)] == ["TransformerEncoderLayer"] * 2 + [
        "TransformerDecoderLayer"] * 3


def test_a_sequential_of_blocks_is_sharded_per_block() -> None:
    blocks = [nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(20)]  # 5 % each
    model = nn.Sequential(nn.Embedding(400, 16), *blocks, nn.LayerNorm(16), nn.Linear(16, 400))
    assert fsdp.units(model) == [model[0], *blocks, model[-1]]
    tiny = nn.Sequential(nn.Linear(400, 400), nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
    assert fsdp.units(tiny) == [tiny[0]]  # a stack far below the share: left to the root


def test_units_by_class_name_and_an_unknown_name() -> None:
    model = GPT(layers=2, dim=32, heads=2)
    assert fsdp.units(model, ["Block"]) == list(model.blocks)
    with pytest.raises(ConfigError, match=r"fsdp_wrap=Blok: no module of class Blok in GPT; its classes are .*Block"):
        fsdp.units(model, ["Blok"])


def test_fp16_with_fsdp_casts_parameters_to_fp16_and_reduces_in_fp32() -> None:
    assert TrainConfig(amp="fp16", strategy="fsdp").amp == "fp16"
    with pytest.raises(ConfigError, match="strategy='zero'"):
        TrainConfig(strategy="zero")
    policies = [fsdp.mixed_precision(amp) for amp in ("bf16", "fp16")]
    assert [(p.param_dtype, p.reduce_dtype) for p in policies] == [  # type: ignore[attr-defined]
        (torch.bfloat16, torch.float32), (torch.float16, torch.float32)]
    assert fsdp.mixed_precision("off") is None
    with pytest.raises(ConfigError, match=r"amp='fp8' is not one of off, bf16, fp16\. HINT"):
        fsdp.mixed_precision("fp8")
    assert make_scaler("fp16", "cpu").is_enabled() and not make_scaler("bf16", "cpu").is_enabled()


def test_rebind_optimizer_points_at_new_parameters() -> None:
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    model.weight = nn.Parameter(model.weight.detach().clone())  # what fully_shard does to each parameter
    fsdp.rebind_optimizer(optimizer, names, model)
    assert optimizer.param_groups[0]["params"][0] is model.weight

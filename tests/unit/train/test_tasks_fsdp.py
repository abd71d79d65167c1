"""Pure parts of the FSDP, task, text and sharded-checkpoint modules (no process group)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchslurm.errors import ConfigError
from torchslurm.train import fsdp, tasks, text
from torchslurm.train.config import TrainConfig
from torchslurm.train.metrics import Totals
from torchslurm.train.models import GPT, Block
from torchslurm.train.strategy import make_scaler


def test_units_by_share_look_into_module_lists() -> None:
    model = GPT(layers=3, dim=32, heads=2)
    chosen = fsdp.units(model, min_share=0.1)
    assert [type(m).__name__ for m in chosen] == ["Embedding", "Block", "Block", "Block", "Linear"]
    assert model.ln_f not in chosen and model.pos not in chosen


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


def test_classification_and_language_model_sums() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    sums = tasks.classification().sums(logits, torch.tensor([0, 0, 0]), torch.tensor(0.5))
    assert sums.tolist() == [1.5, 2.0, 3.0]
    lm = tasks.language_model(flops_per_token=10.0)
    sums = lm.sums(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), torch.tensor(2.0))
    assert sums.tolist() == [12.0, 0.0, 6.0]
    assert lm.metrics(Totals(12.0, 0, 6)) == pytest.approx({"loss": 2.0, "perplexity": 7.389056})
    assert lm.summary(Totals(12.0, 0, 6)) == "Avg Loss: 2.000000, Perplexity: 7.389"
    assert tasks.classification().summary(Totals(3.0, 2, 4)) == "Avg Loss: 0.750000, Accuracy: 50.00%"


def test_text_windows_are_next_tokens_and_deterministic() -> None:
    x, y = text.windows(b"abcdefghij", 3)
    assert x.tolist() == [[97, 98, 99], [100, 101, 102], [103, 104, 105]]
    assert y[0].tolist() == [98, 99, 100]
    a, b = text.stdlib_text(block_size=8, max_bytes=4096), text.stdlib_text(block_size=8, max_bytes=4096)
    assert torch.equal(a[0].tensors[0], b[0].tensors[0])
    with pytest.raises(ConfigError, match="block_size=1"):
        text.windows(b"abc", 1)


def test_gpt_logits_shape_and_flops() -> None:
    model = GPT(block_size=8, dim=16, layers=1, heads=2)
    assert model(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 8, 256)
    assert model.flops_per_token() > 6 * sum(p.numel() for p in Block(16, 2).parameters())

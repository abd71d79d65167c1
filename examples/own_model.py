"""A Hugging-Face-style language model of your own, trained by the Trainer under DDP or FSDP.

The shapes real projects have: a Dataset of dicts of variable length, a collate function that pads
them (`input_ids`, `attention_mask`, `labels` with -100 at the padding), a model whose forward takes
those keywords and returns an output with `loss` and `logits`, and a step of its own that says how
many real tokens the loss is the mean over, so the per-token metrics stay exact across ranks.
Torch only, no download: the text is the Python standard library's own source.

    python examples/own_model.py                                   # one process
    torchslurm run --nproc 2 examples/own_model.py                 # DDP on 2 local ranks
    torchslurm run --nproc 2 examples/own_model.py strategy=fsdp   # FSDP2: parameters sharded
    torchslurm export runs/own_model model.pt                      # the weights, one state_dict file

Settings: --epochs --batch-size --lr --run-dir, --config FILE, key=value; --text-bytes (how much text).
docs/own-model.md walks through it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import torchslurm
from torchslurm.cli.train import add_arguments, from_arguments
from torchslurm.errors import TorchSlurmError
from torchslurm.train import tasks
from torchslurm.train.step import StepResult
from torchslurm.train.text import stdlib_corpus

IGNORE = -100  # the label of a position that counts for nothing (Hugging Face's convention)


@dataclass
class CausalLMOutput:
    """What the model returns, as a Hugging Face model does: the logits, and the loss when given labels."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


class Block(nn.Module):
    """Pre-norm self-attention and MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(attended.transpose(1, 2).reshape(n, t, d))
        return x + self.mlp(self.norm2(x))


class TinyCausalLM(nn.Module):
    """A byte-level causal language model with a Hugging Face model's forward."""

    def __init__(self, vocab_size: int = 256, max_positions: int = 64, dim: int = 64, layers: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(max_positions, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> CausalLMOutput:
        t = input_ids.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()  # causal
        if attention_mask is not None:
            mask = mask & attention_mask[:, None, None, :].bool()  # and no padding as a key
        x = self.embed(input_ids) + self.positions(torch.arange(t, device=input_ids.device))
        for layer in self.layers:
            x = layer(x, mask)
        logits = self.lm_head(self.norm(x))
        loss = None
        if labels is not None:  # predict token i+1 from tokens ..i; padding labelled IGNORE counts for nothing
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=IGNORE)
        return CausalLMOutput(logits, loss)


class Snippets(Dataset[dict[str, torch.Tensor]]):
    """Pieces of the standard library's source, 16 to 64 bytes long, as {"input_ids": tensor}."""

    def __init__(self, text: bytes, seed: int = 0) -> None:
        rng = torch.Generator().manual_seed(seed)
        lengths = torch.randint(16, 65, (len(text) // 16,), generator=rng).tolist()
        tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        self.pieces, start = [], 0
        for length in lengths:
            if start + length > len(tokens):
                break
            self.pieces.append(tokens[start:start + length])
            start += length

    def __len__(self) -> int:
        return len(self.pieces)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.pieces[index]}


def pad(samples: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """The collate function: pad to the longest; labels are the inputs, IGNORE at the padding. Also
    how many tokens are predicted (a plain int, counted here on the CPU: no device sync in the step)."""
    longest = max(len(s["input_ids"]) for s in samples)
    input_ids = torch.zeros(len(samples), longest, dtype=torch.long)
    attention_mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, sample in enumerate(samples):
        input_ids[row, :len(sample["input_ids"])] = sample["input_ids"]
        attention_mask[row, :len(sample["input_ids"])] = 1
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
            "predicted": int((labels[:, 1:] != IGNORE).sum())}


def step(model: nn.Module, batch: dict[str, Any]) -> StepResult:
    """The batch's mean loss per predicted token, and how many there are."""
    output = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    return StepResult(output.loss, n=batch["predicted"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--text-bytes", type=int, default=1 << 17, help="bytes of source text to train on")
    args = parser.parse_intermixed_args()
    defaults = {"epochs": 2, "batch_size": 16, "lr": 0.003, "run_dir": "runs/own_model", "log_every": 20}
    _, cfg = from_arguments(args, defaults)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with torchslurm.init() as ctx:
        text = stdlib_corpus(args.text_bytes)
        cut = len(text) * 9 // 10
        train, val = Snippets(text[:cut]), Snippets(text[cut:])
        torchslurm.seed_everything(cfg.seed)  # the same initial weights on every rank
        model = TinyCausalLM()
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        result = torchslurm.Trainer(model, optimizer, None, train, val, cfg, ctx=ctx, step=step, collate_fn=pad,
                                    task=tasks.language_model()).fit()
        if ctx.is_main and result.val is not None and not result.stopped_early:
            print(f"validation loss {result.val.avg_loss:.4f} per token; weights in {cfg.run_dir}")
    return result.exit_code  # 75 after a preemption stop (checkpoint saved, job requeued)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TorchSlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)

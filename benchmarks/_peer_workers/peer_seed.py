"""(a) The hand-written seed-style DDP loop: init_process_group, DistributedSampler, DDP, per-batch
metrics summed with one all_reduce per epoch, a validation pass per epoch, rank 0 prints a line."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import LR, MOMENTUM, Outcome, Spec, StepClock, checkpoint_note, make_data, make_model
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

ON = ("per-batch loss.item() and correct count", "train metrics: 1 all_reduce per epoch",
      "validation every epoch (1 all_reduce)", "rank-0 epoch line")


def evaluate(model: nn.Module, loader: DataLoader[tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """[loss sum, correct, count] over this rank's shard, summed over all ranks."""
    sums = torch.zeros(3, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for inputs, targets in loader:
            output = model(inputs)
            sums += torch.tensor([F.cross_entropy(output, targets, reduction="sum").item(),
                                  (output.argmax(dim=1) == targets).sum().item(), len(targets)], dtype=torch.float64)
    model.train()
    dist.all_reduce(sums)
    return sums


def train(spec: Spec, clock: StepClock) -> Outcome:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    train_set, val_set = make_data(spec, world_size)
    torch.manual_seed(spec.seed)
    model = DistributedDataParallel(make_model(spec.workload))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    clock.attach(optimizer)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=spec.seed)
    train_loader = DataLoader(train_set, batch_size=spec.batch_size, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=spec.batch_size,
                            sampler=DistributedSampler(val_set, num_replicas=world_size, rank=rank, shuffle=False))
    val = torch.zeros(3, dtype=torch.float64)
    for epoch in range(spec.epochs):
        sampler.set_epoch(epoch)
        model.train()
        total_loss, correct, seen = 0.0, 0, 0
        for inputs, targets in train_loader:
            optimizer.zero_grad()
            output = model(inputs)
            loss = F.cross_entropy(output, targets)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(targets)
            correct += int((output.argmax(dim=1) == targets).sum().item())
            seen += len(targets)
        sums = torch.tensor([total_loss, correct, seen], dtype=torch.float64)
        dist.all_reduce(sums)
        val = evaluate(model, val_loader)
        if rank == 0:
            print(f"Epoch {epoch + 1} - Avg Loss: {val[0] / val[2]:.6f}, Accuracy: {100 * val[1] / val[2]:.2f}% "
                  f"(train loss {sums[0] / sums[2]:.6f})")
    if spec.final_checkpoint and rank == 0:  # the seeds' way: rank 0 alone, one torch.save
        torch.save({"epoch": spec.epochs, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                   spec.checkpoint_path)
    clock.finish()  # worker.py destroys the process group once this DDP model is gone
    return Outcome(rank, float(val[1] / val[2]), ON + checkpoint_note(spec, "rank 0 torch.save of model + optimizer"))

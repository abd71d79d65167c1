"""(c) Lightning Fabric: the user's own loop around fabric.setup / setup_dataloaders / fabric.backward,
with the same metrics as the seed-style loop (fabric.all_reduce once per epoch)."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from common import LR, MOMENTUM, Outcome, Spec, StepClock, checkpoint_note, make_data, make_model
from lightning.fabric import Fabric

ON = ("per-batch loss.item() and correct count", "train metrics: 1 fabric.all_reduce per epoch",
      "validation every epoch (1 fabric.all_reduce)", "fabric.print epoch line", "no loggers")


def train(spec: Spec, clock: StepClock) -> Outcome:
    # Under torchrun, Fabric joins the processes torchrun started; devices × num_nodes must match them.
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                    num_nodes=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]))
    fabric.launch()
    train_set, val_set = make_data(spec, fabric.world_size)
    fabric.seed_everything(spec.seed)
    model = make_model(spec.workload)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    clock.attach(optimizer)
    model, optimizer = fabric.setup(model, optimizer)
    train_loader, val_loader = fabric.setup_dataloaders(
        torch.utils.data.DataLoader(train_set, batch_size=spec.batch_size, shuffle=True),
        torch.utils.data.DataLoader(val_set, batch_size=spec.batch_size))
    val = torch.zeros(3, dtype=torch.float64)
    for epoch in range(spec.epochs):
        model.train()
        total_loss, correct, seen = 0.0, 0, 0
        for inputs, targets in train_loader:
            optimizer.zero_grad()
            output = model(inputs)
            loss = F.cross_entropy(output, targets)
            fabric.backward(loss)
            optimizer.step()
            total_loss += loss.item() * len(targets)
            correct += int((output.argmax(dim=1) == targets).sum().item())
            seen += len(targets)
        sums = fabric.all_reduce(torch.tensor([total_loss, correct, seen], dtype=torch.float64), reduce_op="sum")
        model.eval()
        val = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for inputs, targets in val_loader:
                output = model(inputs)
                val += torch.tensor([F.cross_entropy(output, targets, reduction="sum").item(),
                                     (output.argmax(dim=1) == targets).sum().item(), len(targets)],
                                    dtype=torch.float64)
        val = fabric.all_reduce(val, reduce_op="sum")
        fabric.print(f"Epoch {epoch + 1} - Avg Loss: {val[0] / val[2]:.6f}, Accuracy: {100 * val[1] / val[2]:.2f}% "
                     f"(train loss {sums[0] / sums[2]:.6f})")
    if spec.final_checkpoint:
        fabric.save(spec.checkpoint_path, {"model": model, "optimizer": optimizer, "epoch": spec.epochs})
    clock.finish()
    return Outcome(fabric.global_rank, float(val[1] / val[2]), ON + checkpoint_note(spec, "fabric.save"))

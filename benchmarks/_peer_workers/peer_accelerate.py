"""(e) Hugging Face Accelerate: the user's own loop around accelerator.prepare / accelerator.backward,
with the seed-style metrics (accelerator.reduce once per epoch) and validation through
accelerator.gather_for_metrics, as Accelerate's examples do."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from common import LR, MOMENTUM, Outcome, Spec, StepClock, checkpoint_note, make_data, make_model

ON = ("per-batch loss.item() and correct count", "train metrics: 1 accelerator.reduce per epoch",
      "validation every epoch (gather_for_metrics per batch)", "accelerator.print epoch line",
      "no trackers")


def train(spec: Spec, clock: StepClock) -> Outcome:
    accelerator = Accelerator(cpu=True)
    train_set, val_set = make_data(spec, accelerator.num_processes)
    set_seed(spec.seed)
    model = make_model(spec.workload)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    clock.attach(optimizer)
    model, optimizer, train_loader, val_loader = accelerator.prepare(
        model, optimizer, torch.utils.data.DataLoader(train_set, batch_size=spec.batch_size, shuffle=True),
        torch.utils.data.DataLoader(val_set, batch_size=spec.batch_size))
    accuracy = float("nan")
    for epoch in range(spec.epochs):
        model.train()
        total_loss, correct, seen = 0.0, 0, 0
        for inputs, targets in train_loader:
            optimizer.zero_grad()
            output = model(inputs)
            loss = F.cross_entropy(output, targets)
            accelerator.backward(loss)
            optimizer.step()
            total_loss += loss.item() * len(targets)
            correct += int((output.argmax(dim=1) == targets).sum().item())
            seen += len(targets)
        sums = accelerator.reduce(torch.tensor([total_loss, correct, seen], dtype=torch.float64), reduction="sum")
        model.eval()
        val_loss, val_correct, val_seen = 0.0, 0, 0
        with torch.no_grad():
            for inputs, targets in val_loader:
                output = model(inputs)
                losses, predictions, references = accelerator.gather_for_metrics(
                    (F.cross_entropy(output, targets, reduction="none"), output.argmax(dim=1), targets))
                val_loss += losses.sum().item()
                val_correct += int((predictions == references).sum().item())
                val_seen += len(references)
        accuracy = val_correct / val_seen
        accelerator.print(f"Epoch {epoch + 1} - Avg Loss: {val_loss / val_seen:.6f}, Accuracy: {100 * accuracy:.2f}% "
                          f"(train loss {sums[0] / sums[2]:.6f})")
    if spec.final_checkpoint:
        accelerator.save_state(spec.checkpoint_path)
    clock.finish()  # no trackers, so no end_training(); worker.py destroys the process group
    return Outcome(accelerator.process_index, accuracy, ON + checkpoint_note(spec, "accelerator.save_state"))

"""A save's copies of GPU tensors to the host, made off the training thread's stream.

An epoch-end save is written on a thread of its own while the training thread runs validation, queuing
its kernels on the device's current stream. A `.cpu()` issued on that stream waits for everything queued
there before it: each of a model's few hundred tensors drained validation's queue, so validation, its
launches caught between the copies, ran several times slower than alone (on an H200, the GPT-2 benchmark's
two validations took 3.2 s beside their saves against 0.4 s in a hand loop, docs/benchmarks.md). The
copies run on a side stream instead, after an event the training thread records when it takes the
snapshot: they wait for the steps that made the tensors, not for what was queued since, and the copy
engine works while the card computes. The tensors themselves must not change until the save has read
them (the Trainer's contract for a save beside validation)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


@dataclass(frozen=True)
class Ready:
    """The point on a device's stream after which a snapshot's tensors are complete."""

    device: torch.device
    event: torch.cuda.Event


def device_ready(tensors: Mapping[str, Any]) -> Ready | None:
    """On the thread that made `tensors`: the point on its current CUDA stream after which they are
    complete; None when none of them is on a GPU."""
    device = next((t.device for t in tensors.values() if isinstance(t, torch.Tensor) and t.is_cuda), None)
    if device is None:
        return None
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    return Ready(device, event)


@contextmanager
def copying_after(ready: Ready | None) -> Iterator[None]:
    """On the saving thread: the copies (`.cpu()`) made inside run on a side stream of the snapshot's
    device, once it is `ready`; without a Ready, where they would anyway. (A thread's current CUDA device
    is its own: the saving thread names the snapshot's.)"""
    if ready is None:
        yield
        return
    with torch.cuda.device(ready.device):
        side = _SIDE_STREAMS.get(ready.device)
        if side is None:
            side = _SIDE_STREAMS[ready.device] = torch.cuda.Stream(ready.device)  # type: ignore[no-untyped-call]
        side.wait_event(ready.event)
        with torch.cuda.stream(side):
            yield

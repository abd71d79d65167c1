"""checkpoint.copying on the CPU: nothing to order (the GPU's side stream: benchmarks/gpu_check.py copy_stream)."""

from __future__ import annotations

import torch

from torchslurm.train.checkpoint.copying import copying_after, device_ready


def test_tensors_on_the_cpu_need_no_event_and_copy_where_they_are() -> None:
    tensors = {"w": torch.arange(4.0), "step": 3}
    assert device_ready(tensors) is None
    with copying_after(None):
        assert torch.equal(tensors["w"].cpu(), torch.arange(4.0))

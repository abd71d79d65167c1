"""checkpoint.copying: a save beside validation copies its GPU tensors off the training stream."""

from __future__ import annotations

import threading

import pytest
import torch

from torchslurm.train.checkpoint.copying import copying_after, device_ready


def test_tensors_on_the_cpu_need_no_event_and_copy_where_they_are() -> None:
    tensors = {"w": torch.arange(4.0), "step": 3}
    assert device_ready(tensors) is None
    with copying_after(None):
        assert torch.equal(tensors["w"].cpu(), torch.arange(4.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's streams (run on the device machine)")
def test_a_snapshots_copies_wait_for_the_steps_that_made_it_not_for_work_queued_after() -> None:
    weights = {"w": torch.randn(1 << 20, device="cuda")}
    ready = device_ready(weights)
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(200):  # ~1 s of matmuls queued after the snapshot, as validation's kernels are
        x = torch.nn.functional.normalize(x @ x, dim=1)
    queued = torch.cuda.Event()
    queued.record()
    seen: dict[str, object] = {}

    def save() -> None:  # the saving thread, whose current device is its own
        with copying_after(ready):
            seen["copy"] = weights["w"].cpu()
        seen["queue still running"] = not queued.query()

    thread = threading.Thread(target=save)
    thread.start()
    thread.join()
    assert seen["queue still running"]  # on the training stream the copy would have waited for all of it
    assert torch.equal(seen["copy"], weights["w"].cpu())  # type: ignore[arg-type]

"""A rank's step time split into data, collective and compute, on a real model's backward (a fake clock)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from torchslurm.train.steptime import StepTimes, node_name
from torchslurm.train.topology import Topology


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _times(clock: Clock, world_size: int = 2, time_gradient_sync: bool = True) -> tuple[StepTimes, torch.nn.Module]:
    topo = Topology(rank=0, world_size=world_size, local_rank=0, device=torch.device("cpu"), backend="gloo",
                    num_nodes=1, local_world_size=world_size, master="localhost:29500")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    return StepTimes(model, topo, "node1", every=5, window=3, threshold=1.3, time_gradient_sync=time_gradient_sync,
                     clock=clock), model


def test_waiting_for_the_loader_is_data_time_and_epoch_ends_are_not_counted() -> None:
    clock = Clock()
    times, _ = _times(clock)

    def loader() -> Iterator[int]:
        for item in range(3):
            clock.now += 0.5  # the loader takes 0.5 s per batch
            yield item

    for _ in times.timed(loader()):
        clock.now += 2.0  # the step
    clock.now += 30.0  # validation, the epoch's checkpoint
    for _ in times.timed(loader()):
        clock.now += 2.0
    t = times.since_gather(clock.now)
    assert (t.data_s, t.elapsed_s) == (3.0, 15.0)


def test_the_wait_after_the_last_gradient_is_collective_time() -> None:
    clock = Clock()
    times, model = _times(clock)
    model(torch.randn(8, 4)).sum().backward()  # the hooks see every gradient land at 100.0
    clock.now += 0.25  # DDP waits for the last buckets' all-reduce
    times.backward_done()
    times.backward_done()  # no new gradient since: nothing more
    assert times.since_gather(clock.now).collective_s == 0.25
    times.close()
    model(torch.randn(8, 4)).sum().backward()
    clock.now += 1.0
    times.backward_done()
    assert times.since_gather(clock.now).collective_s == 0.25  # hooks removed


def test_without_gradient_sync_or_peers_nothing_is_hooked_or_gathered() -> None:
    clock = Clock()
    times, model = _times(clock, time_gradient_sync=False)
    model(torch.randn(8, 4)).sum().backward()
    clock.now += 1.0
    times.backward_done()
    assert times.since_gather(clock.now).collective_s == 0.0
    alone, _ = _times(clock, world_size=1)
    assert alone.every == 0 and list(alone.timed([1, 2])) == [1, 2]
    assert [alone.step_done(step) for step in range(1, 11)] == [None] * 10


def test_the_node_is_slurms_name_for_it() -> None:
    assert node_name({"SLURMD_NODENAME": "gpu07"}) == "gpu07"
    assert node_name({}) != ""

"""train.stopagreement: the reasons to stop, the steps between checks, and the one all_reduce that makes
every rank stop after the same step (on Gloo, and on NCCL played on the CPU)."""

from __future__ import annotations

import pytest
import torch
from tests.unit.train.fakepeers import Cuda, Peers

from torchslurm.train.stopagreement import MAX_CHECK_EVERY, Agreement, StopRequest, check_interval


@pytest.mark.parametrize(("step_s", "period_s", "minimum", "expected"), [
    (None, 0.2, 1, 1),       # step time not known yet
    (0.01, 0.2, 1, 20),      # 10 ms steps: one check per 20 steps
    (0.5, 0.2, 1, 1),        # slow steps: every step
    (0.01, 0.2, 50, 50),     # never below check_every
    (0.01, 0.0, 3, 3),       # period 0: every check_every steps
    (0.0, 0.2, 1, MAX_CHECK_EVERY), (1e-6, 0.2, 1, MAX_CHECK_EVERY),
])
def test_check_interval_aims_at_the_period(step_s: float | None, period_s: float, minimum: int,
                                           expected: int) -> None:
    assert check_interval(step_s, period_s, minimum) == expected


def test_a_period_of_zero_checks_every_check_every_steps_even_with_instant_steps() -> None:
    assert check_interval(0.0, 0.0, 1) == 1


def test_stop_request_reasons() -> None:
    assert not StopRequest(False, False, False).stop
    assert StopRequest(True, True, False).describe("USR2", 60) == "SIGUSR2 and SIGTERM"
    assert StopRequest(False, False, True).describe("USR1", 60) == "the deadline (60 s before the time limit)"
    assert StopRequest(True, False, True, True).describe("USR1", 1.5) == (
        "SIGUSR1 and the deadline (1.5 s before the time limit) and Ctrl-C (SIGINT)")
    assert StopRequest(False, False, False).describe("USR2", 60) == "nothing"
    assert StopRequest(False, True, False).stop and not StopRequest(False, True, False).wants_requeue
    assert StopRequest(False, False, True).wants_requeue


def test_with_nccl_the_host_waits_only_for_the_flags_copied_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA a blocking copy would wait for the GPU's whole queue: the flags go to the device from pinned
    memory without blocking, the stream (not the host) waits for the all_reduce, the answer comes back into
    pinned memory behind an event, and result() waits for that event alone. The agreed interval comes back
    whole, even one a float32 would round (check_every has no upper bound)."""
    peers = Peers(0, [0, 1, 0, 0, 2**24 + 1], backend="nccl")
    cuda = Cuda(peers.log)
    peers.install(monkeypatch)
    cuda.install(monkeypatch)
    agreement = Agreement(StopRequest(True, False, False), 7)
    assert cuda.log == ["pinned -> device 3, non_blocking=True", "all_reduce", "wait for the all_reduce",
                        "device 3 -> pinned, non_blocking=True", "event recorded"]
    assert [cuda.where(t) for t in peers.tensors] == ["device 3"] and not agreement.ready
    assert agreement.result() == (StopRequest(True, True, False), 2**24 + 1)
    assert cuda.log[5:] == ["the host waits for the event"]


@pytest.mark.parametrize(("mine", "peer", "agreed"), [
    (StopRequest(True, False, False), [0, 1, 0, 0, 3], (StopRequest(True, True, False), 7)),
    (StopRequest(False, False, False), [0, 0, 1, 1, 9], (StopRequest(False, False, True, True), 9)),
    (StopRequest(False, False, False), [1, 0, 0, 0, 1], (StopRequest(True, False, False), 7)),
])
def test_an_agreement_is_one_max_all_reduce_of_the_flags_and_the_interval(
        monkeypatch: pytest.MonkeyPatch, mine: StopRequest, peer: list[int],
        agreed: tuple[StopRequest, int]) -> None:
    peers = Peers(0, peer)
    peers.install(monkeypatch)
    agreement = Agreement(mine, 7)
    assert not agreement.ready and peers.waits == 0  # started, not waited for
    flags = [int(mine.warning), int(mine.terminate), int(mine.deadline), int(mine.interrupt), 7]
    assert peers.reduced == [(flags, torch.distributed.ReduceOp.MAX, True, torch.int32, "cpu")]
    assert agreement.result() == agreed and peers.waits == 1

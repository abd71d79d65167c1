"""A key namespace that only this round's ranks share, in a store that outlives rounds.

torchrun's agent hosts the workers' store and keeps it across restarts, so keys written by the
dead workers of an earlier round (their Gloo addresses above all) are still there. Naming the
round by TORCHELASTIC_RESTART_COUNT is not enough: the agents' counts differ, because an agent
that restarts its workers for another node's failure does not count it ("membership changes do
not count as retries", torch.distributed.elastic.agent.server.api): after one such round, one
node's workers would wait under attempt1 while another's use attempt0.

So rank 0 picks a fresh namespace and hands it to every other rank:
  rank r > 0: hello/r = a fresh token u, then wait for welcome/r/u (a key no earlier round wrote),
              which holds the namespace, and acknowledge with ack/<namespace token>/r;
  rank 0:     answer every hello it sees (a stale one from a dead rank too: harmless) until each
              rank has acknowledged.
The old round's workers are all gone before the agents start a new round, so nothing else writes.
The cost does not grow with the ranks' polling: a rank waits inside the store (server side), and
rank 0 reads all hellos and checks all acknowledgements in one request each (benchmarks/handshake.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from torchslurm.errors import DistributedError

POLL_S = 0.05
"""Rank 0's pause between two rounds of reading hellos and checking acknowledgements."""
WAIT_S = 1.0
"""The longest one wait inside the store, so that the deadline is checked in between."""


class KeyStore(Protocol):
    """The part of a torch.distributed Store used here."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...

    def wait(self, keys: list[str], timeout: timedelta) -> None: ...

    def multi_get(self, keys: list[str]) -> list[bytes]: ...


def agree_namespace(store: KeyStore, rank: int, world_size: int, timeout_s: float,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> str:
    """The namespace (`torchslurm/<token>/`) of this round, the same on every rank of it."""
    deadline = clock() + timeout_s
    if rank == 0:
        return _lead(store, world_size, deadline, clock, sleep)
    return _follow(store, rank, deadline, clock, sleep)


def _lead(store: KeyStore, world_size: int, deadline: float, clock: Callable[[], float],
          sleep: Callable[[float], None]) -> str:
    token = uuid.uuid4().hex
    namespace = f"torchslurm/{token}/"
    followers = range(1, world_size)
    hellos = [f"torchslurm/hello/{r}" for r in followers]
    acks = [f"torchslurm/ack/{token}/{r}" for r in followers]
    answered: dict[int, bytes] = {}
    while world_size > 1:
        if store.check(hellos):  # every rank has said hello (this round or an earlier one)
            fresh = {r: hello for r, hello in zip(followers, store.multi_get(hellos), strict=True)
                     if answered.get(r) != hello}
            for r, hello in fresh.items():  # each rank's hello once (stale ones: once more per rank)
                store.set(f"torchslurm/welcome/{r}/{hello.decode()}", namespace)
            answered.update(fresh)
            if store.check(acks):
                break
        if clock() > deadline:
            missing = [r for r, ack in zip(followers, acks, strict=True) if not store.check([ack])]
            raise DistributedError(
                f"rank 0: rank(s) {', '.join(map(str, missing))} of {world_size} did not arrive "
                "within the process group timeout.", "their nodes' logs say why (not started, "
                "crashed during start-up, or still starting: raise timeout_s).", exit_code=1)
        sleep(POLL_S)
    return namespace


def _follow(store: KeyStore, rank: int, deadline: float, clock: Callable[[], float],
            sleep: Callable[[float], None]) -> str:
    mine = uuid.uuid4().hex
    store.set(f"torchslurm/hello/{rank}", mine)
    welcome = f"torchslurm/welcome/{rank}/{mine}"
    while not _arrived(store, welcome, min(WAIT_S, max(deadline - clock(), POLL_S))):  # 0 might mean no limit
        if clock() > deadline:
            raise DistributedError(
                f"rank {rank}: rank 0 did not answer within the process group timeout.",
                "rank 0's log says why (not started, crashed during start-up, or still starting: raise timeout_s).",
                exit_code=1)
        sleep(POLL_S)  # a store that fails at once (gone) is not asked in a busy loop
    namespace = store.get(welcome).decode()
    store.set(f"torchslurm/ack/{namespace.split('/')[1]}/{rank}", "1")
    return namespace


def _arrived(store: KeyStore, key: str, timeout_s: float) -> bool:
    """Wait inside the store for `key`; False when it did not come within timeout_s."""
    try:
        store.wait([key], timedelta(seconds=timeout_s))
    except RuntimeError:  # torch's DistStoreError on a timeout
        return store.check([key])
    return True

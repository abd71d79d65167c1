"""torchslurm.runtime.handshake: the ranks of one torchrun round agree on a fresh key namespace in a store
that still holds an earlier round's keys (a dict-backed store, then torch's TCPStore in threads)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest

from torchslurm.errors import DistributedError
from torchslurm.runtime.handshake import agree_namespace


class DictStore:
    """set/get/check/wait/multi_get like torch's Store, thread-safe, on a dict. `sleep` stands in
    for the time a wait for a missing key takes (a fake clock in the timeout tests)."""

    def __init__(self, sleep: Callable[[float], None] | None = None) -> None:
        self.data: dict[str, bytes] = {}
        self.changed = threading.Condition()
        self.sleep = sleep

    def set(self, key: str, value: str) -> None:
        with self.changed:
            self.data[key] = value.encode()
            self.changed.notify_all()

    def get(self, key: str) -> bytes:
        with self.changed:
            return self.data[key]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        with self.changed:
            return [self.data[k] for k in keys]

    def check(self, keys: list[str]) -> bool:
        with self.changed:
            return all(k in self.data for k in keys)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        if self.sleep is not None and not self.check(keys):
            self.sleep(timeout.total_seconds())
        elif self.sleep is None:
            with self.changed:
                self.changed.wait_for(lambda: all(k in self.data for k in keys), timeout.total_seconds())
        if not self.check(keys):
            raise RuntimeError("Wait timeout")  # what torch's DistStoreError is


def run_round(store_of: Callable[[int], object], world_size: int, timeout_s: float = 30) -> list[str]:
    """Every rank in its own thread with its own store client; their namespaces in rank order."""
    found: list[str | BaseException] = [""] * world_size

    def rank(r: int) -> None:
        try:
            found[r] = agree_namespace(store_of(r), r, world_size, timeout_s)  # type: ignore[arg-type]
        except BaseException as exc:
            found[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    errors = [f for f in found if isinstance(f, BaseException)]
    assert not errors, errors
    return [str(f) for f in found]


def test_every_rank_of_a_round_gets_the_same_fresh_namespace_despite_stale_keys() -> None:
    store = DictStore()
    first = run_round(lambda r: store, 4)
    assert len(set(first)) == 1 and first[0].startswith("torchslurm/") and first[0].endswith("/")
    # The next round finds the first round's hello/welcome/ack keys, and stale hellos of ranks
    # that died before answering: it still agrees, on another namespace.
    store.set("torchslurm/hello/2", "deadbeef")
    second = run_round(lambda r: store, 4)
    assert len(set(second)) == 1 and second[0] != first[0]


def test_a_rank_that_never_arrives_is_named_by_rank_0_and_rank_0_missing_by_the_others() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def sleep(s: float) -> None:
        now[0] += s

    store = DictStore(sleep)
    store.set("torchslurm/hello/1", "stale")  # rank 1 of an earlier round: never acknowledges
    with pytest.raises(DistributedError, match=r"rank 0: rank\(s\) 1, 2 of 3 did not arrive within the process "
                                               r"group timeout\. HINT: their nodes' logs"):
        agree_namespace(store, 0, 3, 5.0, clock=clock, sleep=sleep)
    with pytest.raises(DistributedError, match=r"rank 2: rank 0 did not answer within the process group timeout"):
        agree_namespace(DictStore(sleep), 2, 3, 5.0, clock=clock, sleep=sleep)


def test_with_torchs_tcp_store_as_torchruns_agent_hosts_it() -> None:
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def client(rank: int) -> TCPStore:
        return TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))

    first = run_round(client, 3)
    server.set("torchslurm/hello/1", "stale")  # a rank of the first round that died after its hello
    again = run_round(client, 3)
    assert len(set(first)) == len(set(again)) == 1 and first[0] != again[0]

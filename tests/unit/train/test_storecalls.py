"""Store calls from torchslurm's own threads: counters read in one request, every call bounded in time,
a client in the run's part of a real store."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from torch._C._distributed_c10d import PrefixStore, TCPStore

from torchslurm.train.storecalls import read_counters, within


class _CountingStore:
    """A real store client that counts the requests made through it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.requests = inner, 0

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            self.requests += 1
            return getattr(self.inner, name)(*args)
        return call


def test_counters_of_every_rank_are_read_in_one_request_when_all_exist() -> None:
    server = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=5), wait_for_workers=False)
    store = _CountingStore(PrefixStore("run/", server))
    keys = [f"beat/{rank}" for rank in range(64)]
    for rank, key in enumerate(keys):
        store.inner.add(key, rank)
    assert read_counters(store, keys) == list(range(64))  # type: ignore[arg-type]
    assert store.requests == 2  # check + multi_get, not 64 reads
    store.requests = 0
    assert read_counters(store, [*keys[:3], "beat/never"]) == [0, 1, 2, 0]  # type: ignore[arg-type]
    assert store.requests == 1 + 4  # a missing key: one read each, the missing one as 0


def test_a_bounded_call_returns_its_value_or_raises_its_error() -> None:
    assert within(5, lambda: 42) == 42
    with pytest.raises(KeyError, match="beat/3"):
        within(5, lambda: {}["beat/3"])


def test_a_call_that_does_not_return_in_time_is_a_timeout_and_leaves_only_a_daemon_thread() -> None:
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"the store did not answer within 0.2 s"):
        within(0.2, release.wait)
    assert time.monotonic() - started < 5
    (blocked,) = [t for t in threading.enumerate() if t.name == "torchslurm-store-call"]
    assert blocked.daemon
    release.set()
    blocked.join(5)

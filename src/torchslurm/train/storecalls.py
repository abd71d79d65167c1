"""Calls on the job's TCPStore from threads of torchslurm's own (the watchdog's heartbeat and diagnosis,
the hang detector): a client of their own, counters read in one request, every call bounded in time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

    from torchslurm.runtime.distributed import DistContext

_T = TypeVar("_T")

STORE_TIMEOUT_S = 5.0
"""A new client's connect timeout, unless the caller gives its own."""


def store_client(ctx: DistContext, timeout_s: float = STORE_TIMEOUT_S) -> Store:
    """A new client of the job's store, in this run's part of it (a thread of its own needs its own
    client: one TCPStore client serves one request at a time)."""
    from torch._C._distributed_c10d import PrefixStore, TCPStore

    env = ctx.env
    store = TCPStore(env.master_addr, env.master_port, is_master=False,
                     timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    return PrefixStore(ctx.store_prefix, store)


def read_counters(store: Store, keys: list[str]) -> list[int]:
    """Counters kept with `add`: one request for all when every key exists (N ranks reading N keys each
    is N requests, not N²), else one `add(key, 0)` each, which reads a missing key as 0."""
    if keys and store.check(keys):
        return [int(value) for value in store.multi_get(keys)]
    return [int(store.add(key, 0)) for key in keys]


def within(seconds: float, call: Callable[[], _T]) -> _T:
    """call() in a daemon thread; TimeoutError when it has not returned within `seconds`. A TCPStore
    client's connect ignores its own timeout while the server process is stopped (SIGSTOP; measured
    here: blocked for good), so every store call of the watchdog is bounded this way; a call left
    blocked only holds a daemon thread."""
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller below
            outcome.append((False, exc))

    worker = threading.Thread(target=run, name="torchslurm-store-call", daemon=True)
    worker.start()
    worker.join(seconds)
    if not outcome:
        raise TimeoutError(f"the store did not answer within {seconds:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]

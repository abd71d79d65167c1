"""Whether the store a rank connected to is its own job's: the store's host writes a token derived
from the job's secret (runtime.ports.JOB_SECRET) under OWNER_KEY, and every other rank checks it
before using the store. A process of another user that bound the port first cannot write that
token, so the ranks stop with an error naming host:port instead of trusting its answers.

This proves who answers, not who else writes: a TCPStore has no authentication, and any process
that reaches the port may read and write keys, as with torchrun's (docs/security.md). Under torchrun
the store is its agent's, which torchslurm does not start, so there is nothing to check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Protocol

from torchslurm.errors import DistributedError
from torchslurm.runtime.ports import job_secret

OWNER_KEY = "torchslurm/owner"


class OwnedStore(Protocol):
    """The part of a torch.distributed Store used here."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def wait(self, keys: list[str], timeout: timedelta) -> None: ...


def token(environ: Mapping[str, str]) -> str | None:
    """The token this job's store holds: a one-way function of its secret (the secret itself never
    reaches the store); None for a job without a secret."""
    secret = job_secret(environ)
    return None if secret is None else hashlib.sha256(f"torchslurm store of {secret}".encode()).hexdigest()


def settle(store: OwnedStore, hosts: bool, expected: str, where: str, timeout_s: float) -> None:
    """On the store's host: write the token. Elsewhere: wait for it (the host writes it as soon as
    every rank connected) and compare; an error naming `where` (host:port) when it differs or
    never comes."""
    if hosts:
        store.set(OWNER_KEY, expected)
        return
    try:
        store.wait([OWNER_KEY], timedelta(seconds=timeout_s))
        found = store.get(OWNER_KEY).decode(errors="replace")
    except RuntimeError as exc:  # torch's DistStoreError: a timeout, or the peer closed the connection
        raise not_ours(where, f"it did not show this job's token within {timeout_s:g} s ({exc})") from exc
    if found != expected:
        raise not_ours(where, "it holds another job's token")


def not_ours(where: str, what: str) -> DistributedError:
    return DistributedError(
        f"the store at {where} is not this job's: {what}. Another process, possibly another user's, listens "
        "on the port this job's store should have.",
        f"check who listens there (`ss -ltnp 'sport = :{where.rsplit(':', 1)[-1]}'` on {where.rsplit(':', 1)[0]}) "
        "and submit the job again (its port is drawn anew).", exit_code=1)

"""runtime.storeproof: the ranks use a store only once it shows their job's token (torch's real
TCPStore on loopback; a squatter is another TCPStore holding the port first)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from torch._C._distributed_c10d import TCPStore

from torchslurm.errors import DistributedError
from torchslurm.runtime import distributed, storeproof
from torchslurm.runtime.distenv import DistEnv
from torchslurm.runtime.ports import JOB_SECRET

SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def test_the_token_is_the_jobs_and_does_not_reveal_its_secret() -> None:
    token = storeproof.token({JOB_SECRET: SECRET})
    assert token is not None and SECRET not in token and len(token) == 64
    assert token != storeproof.token({JOB_SECRET: "1" + SECRET[1:]})
    assert storeproof.token({}) is None  # a job script of the user's own: nothing to check


def _env(rank: int, port: int) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank, world_size=2, local_world_size=2, node_rank=0, num_nodes=1,
                   master_addr="127.0.0.1", master_port=port, launcher="srun", job_id="4242", reason="test")


def test_the_ranks_of_one_job_prove_their_store(free_port: Callable[[], int]) -> None:
    port = free_port()
    token = storeproof.token({JOB_SECRET: SECRET})
    stores: list[tuple[object, str]] = []  # the host's store serves as long as it is held
    host = threading.Thread(target=lambda: stores.append(distributed._store(_env(0, port), timedelta(seconds=20),
                                                                            token)))
    host.start()
    client = distributed._store(_env(1, port), timedelta(seconds=20), token)
    host.join()
    assert [prefix for _, prefix in [*stores, client]] == [distributed.RUN_PREFIX] * 2


@pytest.mark.parametrize("squatter_token", [None, "another job's"])
def test_a_store_that_is_not_the_jobs_is_refused_naming_it(free_port: Callable[[], int],
                                                           squatter_token: str | None) -> None:
    """Another user bound the job's port first: its store either says nothing or holds another token."""
    port = free_port()
    squatter = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    if squatter_token is not None:
        squatter.set(storeproof.OWNER_KEY, squatter_token)
    what = "it holds another job's token" if squatter_token else r"it did not show this job's token within 1 s"
    with pytest.raises(DistributedError, match=rf"^the store at 127\.0\.0\.1:{port} is not this job's: {what}.*"
                                               rf"HINT: check who listens there \(`ss -ltnp 'sport = :{port}'` on "
                                               r"127\.0\.0\.1\) and submit the job again"):
        distributed._store(_env(1, port), timedelta(seconds=1), storeproof.token({JOB_SECRET: SECRET}))

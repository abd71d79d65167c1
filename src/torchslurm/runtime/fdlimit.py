"""Open files on the host of the job's TCPStore: one socket per client connection.

Every rank holds STORE_CLIENTS_PER_RANK connections to the store (the process group's own client,
the Trainer's heartbeat and its hang detector), so the store's process needs about that many file
descriptors per rank on top of its own. A common soft limit is 1,024: 4,096 ranks would need over
12,000, and the store refuses connections (EMFILE) long before anything else breaks. The soft limit
may be raised up to the hard one without privileges; `plan` says how far, or what to tell the user.
"""

from __future__ import annotations

from dataclasses import dataclass

STORE_CLIENTS_PER_RANK = 3
OWN_FILES = 256
"""Room for the store host's own files (libraries, logs, checkpoints, data loader pipes)."""


@dataclass(frozen=True)
class FdPlan:
    raise_to: int | None
    """The new soft limit, or None to leave it."""
    warning: str | None
    """Set when even the hard limit is too low."""


def needed(world_size: int) -> int:
    return world_size * STORE_CLIENTS_PER_RANK + OWN_FILES


def plan(world_size: int, soft: int, hard: int, unlimited: int = -1) -> FdPlan:
    """The store host's soft RLIMIT_NOFILE for `world_size` ranks (`unlimited`: RLIM_INFINITY)."""
    need = needed(world_size)
    if soft == unlimited or soft >= need:
        return FdPlan(None, None)
    if hard == unlimited or hard >= need:
        return FdPlan(need, None)
    return FdPlan(hard if hard > soft else None,
                  f"this rank hosts the job's store for {world_size} ranks, which needs about {need} open files "
                  f"({STORE_CLIENTS_PER_RANK} connections a rank), but the hard limit is {hard}: the store will "
                  f"refuse connections (EMFILE) and ranks will time out at start-up. HINT: ask the admins to "
                  f"raise the nofile limit (limits.conf, or slurm.conf PropagateResourceLimits), or run fewer ranks.")

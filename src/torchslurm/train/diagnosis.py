"""What a failed collective means, told root cause first: which ranks went silent, on which host,
and why the others stopped. Pure: the watchdog (train.watchdog) gathers the facts (heartbeat counters,
the store's answer, the ranks' own errors) and raises what `diagnosis` returns."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from torchslurm.errors import DistributedError

_ADDRESS = re.compile(r"\[(?:::ffff:)?([0-9a-fA-F:.]+)\]:[0-9]+")


@dataclass(frozen=True)
class Peer:
    """Where one rank runs (gathered once at start)."""

    rank: int
    host: str
    address: str
    pid: int = 0
    """Its process id (0: unknown); checked only from the same host and PID namespace."""
    pid_namespace: str = ""
    """/proc/self/ns/pid of its process: PIDs compare only within one namespace."""
    hosts_store: bool = False
    """It hosts the job's store (rank 0, or under srun the first task of the master's node)."""
    node: str = ""
    """The Slurm node name (SLURMD_NODENAME; '' outside Slurm): what ExcNodeList takes."""


def store_peer(peers: Sequence[Peer]) -> Peer:
    """The rank that hosts the store (rank 0 when none says so, as in torch)."""
    return next((p for p in peers if p.hosts_store), peers[0])


def peer_address(error_text: str) -> str | None:
    """The remote IP in a Gloo error ("Connection closed by peer [198.18.0.12]:41234"), if any."""
    match = _ADDRESS.search(error_text)
    return match.group(1) if match else None


def first_sentence(error_text: str) -> str:
    """The informative part of a c10d/Gloo error: no `[file.cc:553]` prefix, no advice paragraph."""
    lines = error_text.strip().splitlines()
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):[0-9]+\]\s*", "", lines[0] if lines else "")
    return text.split(". ")[0].rstrip(".") or "no message"


def silent_ranks(before: Mapping[int, int], after: Mapping[int, int],
                 saw_failure: Collection[int] = ()) -> list[int]:
    """Ranks whose heartbeat counter did not advance between two reads and that did not report the
    failure themselves (those are alive: their heartbeat may stop because they already exited)."""
    return sorted(rank for rank, count in after.items() if before.get(rank) == count and rank not in saw_failure)


def describe_ranks(ranks: Sequence[int], peers: Sequence[Peer]) -> str:
    """'rank 3 on node2 (198.18.0.12)' / 'ranks 2, 3 on node2 (198.18.0.12)', grouped by host."""
    by_host: dict[str, list[int]] = {}
    for rank in ranks:
        peer = peers[rank]
        by_host.setdefault(f"{peer.host} ({peer.address})", []).append(rank)
    parts = []
    for host, group in by_host.items():
        word = "rank" if len(group) == 1 else "ranks"
        parts.append(f"{word} {', '.join(map(str, group))} on {host}")
    return "; ".join(parts)


def diagnosis(me: Peer, error: str, peers: Sequence[Peer], silent: Sequence[int] | None,
              bound_s: float | None, store: str = "ok", errors: Mapping[int, str] | None = None,
              unsure: Sequence[int] = ()) -> DistributedError:
    """The root-cause-first error (exit code 1). `silent`: ranks with a stopped heartbeat; None: the store
    (store_peer's) could not be asked, and `store` says why: 'refused', 'timeout' or 'slow' (it accepts
    connections but does not answer in time). `errors`: what the silent ranks that stopped on an
    error of their own said. `unsure`: ranks without a recent heartbeat that may well be alive (their
    process still runs, or the store was too slow to tell): never named as the cause."""
    seen = f"(rank {me.rank} on {me.host} saw: {first_sentence(error)})"
    late = (f"could not tell whether {describe_ranks(unsure, peers)} failed: no recent heartbeat, but "
            "heartbeats come late when the store's host is overloaded (more ranks than CPUs?), so it may be alive"
            if unsure else "")
    host = store_peer(peers)
    if silent is None and store == "slow":
        cause = (f"could not tell which rank failed: rank {host.rank}'s store on {host.host} ({host.address}) "
                 "accepts connections but answers too slowly to read the heartbeats (an overloaded host: more "
                 "ranks than CPUs?)")
    elif silent is None and store == "refused":
        cause = (f"rank {host.rank} on {host.host} ({host.address}) died: its host answers but its store "
                 "refuses connections")
    elif silent is None:
        cause = (f"rank {host.rank}'s host {host.host} ({host.address}) is unreachable from {me.host}: "
                 "that node or the network between the nodes is down")
    elif silent:
        errors = errors or {}
        failed = [rank for rank in silent if rank in errors]
        causes = [f"{describe_ranks([rank], peers)} stopped with an error: {errors[rank]} (its log has all of it)"
                  for rank in failed]
        if len(failed) < len(silent):
            causes.append(f"{describe_ranks([r for r in silent if r not in errors], peers)} stopped responding "
                          "(no heartbeat): the process died (killed, crashed, out of memory) or its node or "
                          "network went away")
        cause = "; ".join(causes + ([late] if late else []))
    elif unsure:
        cause = late
    else:
        address = peer_address(error)
        named = [p.rank for p in peers if address and p.address == address]
        where = f" with {describe_ranks(named, peers)}" if named else ""
        cause = f"a collective failed{where} while every rank still has a heartbeat"
    bound = f" ({bound_s:g} s)" if bound_s is not None else ""
    return DistributedError(
        f"{cause} {seen}. Every rank stops within the process group timeout{bound}.",
        "read the first failing rank's log (srun prints 'task N: ...' for it); for a node or network problem "
        "check `scontrol show node`; the job resumes from its last checkpoint when requeued.", exit_code=1)

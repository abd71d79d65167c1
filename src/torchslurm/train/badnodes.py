"""Bad nodes out of the next attempt: whether a rank's error points at its node, and which nodes the
requeued job may exclude so that it can still be scheduled. Pure: the watchdog (train.watchdog)
hands in the error texts and what it found, train.requeue runs the Slurm commands.

Node-level means: the same program would very likely run on another node. Read from the messages
CUDA and NCCL print (cudaGetErrorString, ncclGetErrorString):

- `uncorrectable ECC error encountered` (cudaErrorECCUncorrectable): the GPU's memory failed.
- `unspecified launch failure` (cudaErrorLaunchFailure): a kernel died without a precise cause; in
  practice mostly a GPU fault (an Xid), occasionally a kernel bug, so the exclusion is bounded.
- `GPU has fallen off the bus`, `GPU is lost` (the driver's words): the device is gone.
- `CUDA-capable device(s) is/are busy or unavailable` (cudaErrorDevicesUnavailable): a GPU held by
  another process in exclusive mode, or broken.
- `system not yet initialized` (cudaErrorSystemNotReady): the node's fabric manager is not running.
- NCCL `unhandled system error` (ncclSystemError): a system call or the network stack failed on the
  node that reports it (its peer's death reads `remote process exited`, ncclRemoteError instead).

Not node-level (the program's own bug, it fails the same on any node): `an illegal memory access
was encountered`, `device-side assert triggered`, `misaligned address`, `CUDA out of memory`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchslurm import hostlist
from torchslurm.runtime.variables import is_digits
from torchslurm.train.diagnosis import Peer

DEFAULT_MAX_EXCLUDED_NODES = 4
"""At most this many nodes in the job's ExcNodeList after an exclusion (yours included)."""

NODE_LEVEL: tuple[tuple[str, str], ...] = (
    ("uncorrectable ecc error", "an uncorrectable ECC error"),
    ("unspecified launch failure", "a CUDA unspecified launch failure"),
    ("fallen off the bus", "a GPU that fell off the bus"),
    ("gpu is lost", "a lost GPU"),
    ("busy or unavailable", "a CUDA device that is busy or unavailable"),
    ("system not yet initialized", "a GPU system that is not initialized (fabric manager)"),
    ("unhandled system error", "an NCCL system error"),
)
"""(what the message says, lower case; how the log names it)."""

_OWN = re.compile(r"CUDA error|CUDA out of memory|CUBLAS_STATUS_|cuDNN error|CUDA driver error")
_NULL = ("", "(null)", "None")


def node_level_reason(error_text: str) -> str | None:
    """How the log names the node-level fault in `error_text` ('an uncorrectable ECC error'); None
    when the error does not point at the node."""
    text = error_text.lower()
    return next((words for sign, words in NODE_LEVEL if sign in text), None)


def own_error(error_text: str) -> bool:
    """Whether a RuntimeError is this rank's own device error (CUDA, cuBLAS, cuDNN), not a collective
    that failed because a peer went away: the watchdog then names this rank instead of diagnosing."""
    return bool(_OWN.search(error_text))


@dataclass(frozen=True)
class NodeFault:
    """A node the next attempt should avoid, and why."""

    node: str
    """The Slurm node name (SLURMD_NODENAME; the host name when Slurm did not say)."""
    rank: int
    reason: str
    """'rank 5 failed with an uncorrectable ECC error'."""


def fault_of(node: str, rank: int, error_text: str) -> NodeFault | None:
    """The fault when `rank`'s error on `node` is node-level, else None."""
    words = node_level_reason(error_text)
    return None if words is None or not node else NodeFault(node, rank, f"rank {rank} failed with {words}")


@dataclass(frozen=True)
class JobNodes:
    """What `scontrol show job` says about where a job may run."""

    partitions: tuple[str, ...]
    nodes_needed: int
    """The fewest nodes it asks for (NumNodes=2 or 2-4)."""
    excluded: tuple[str, ...]
    """ExcNodeList, expanded."""
    required: tuple[str, ...]
    """ReqNodeList (--nodelist), expanded: never excluded (the job could not start)."""


def job_nodes(fields: Mapping[str, str]) -> JobNodes:
    """JobNodes from `scontrol show job` fields; HostlistError for a list Slurm would not print."""
    needed = fields.get("NumNodes", "1").split("-")[0]
    return JobNodes(tuple(p for p in fields.get("Partition", "").split(",") if p),
                    int(needed) if is_digits(needed) else 1,
                    tuple(excluded_nodes(fields)), tuple(_expand(fields.get("ReqNodeList", ""))))


def excluded_nodes(fields: Mapping[str, str]) -> list[str]:
    """The job's ExcNodeList, expanded ([] when Slurm prints `(null)`)."""
    return _expand(fields.get("ExcNodeList", ""))


def _expand(text: str) -> list[str]:
    return [] if text.strip() in _NULL else hostlist.expand(text.strip())


@dataclass(frozen=True)
class ExclusionPlan:
    """What to write into the job's ExcNodeList, and the log line."""

    exclude: tuple[str, ...]
    """The whole new ExcNodeList; empty: leave it as it is."""
    added: tuple[str, ...]
    message: str


def plan_exclusion(faults: Sequence[NodeFault], job: JobNodes, partition_nodes: Sequence[str] | None,
                   max_excluded: int = DEFAULT_MAX_EXCLUDED_NODES) -> ExclusionPlan:
    """Exclude the faulty nodes, merged with the job's ExcNodeList, as long as it stays at most
    `max_excluded` nodes and at least `job.nodes_needed` nodes of its partitions stay allowed
    (counted whatever their state: a drained node may come back; a job needing more than there are
    would pend for ever, PartitionConfig). `partition_nodes`: None when sinfo could not say."""
    excluded, added, skipped = list(job.excluded), list[NodeFault](), list[str]()
    for fault in faults:
        if fault.node in excluded:
            continue
        trial = [*excluded, fault.node]
        left = None if partition_nodes is None else [n for n in dict.fromkeys(partition_nodes) if n not in trial]
        why = ("max_excluded_nodes=0 turns exclusion off" if max_excluded == 0 else
               f"the job's ExcNodeList would exceed max_excluded_nodes={max_excluded}" if len(trial) > max_excluded
               else f"{fault.node} is in its --nodelist" if fault.node in job.required
               else "sinfo could not list its partition" if left is None
               else f"only {len(left)} node(s) of partition {','.join(job.partitions) or '?'} would be left for a "
                    f"{job.nodes_needed}-node job" if len(left) < job.nodes_needed else None)
        if why is None:
            excluded, added = trial, [*added, fault]
        else:
            skipped.append(f"kept {fault.node} although {fault.reason}: {why}")
    lines = [f"excluded {f.node} from the next attempt: {f.reason}" for f in added] + skipped
    if not lines:
        lines = [f"{', '.join(dict.fromkeys(f.node for f in faults))} already excluded from the next attempt"]
    return ExclusionPlan(tuple(excluded) if added else (), tuple(f.node for f in added), "; ".join(lines))



def silent_nodes(peers: Sequence[Peer], silent: Sequence[int], errors: Mapping[int, str]) -> list[Peer]:
    """The first rank of each node whose every rank went silent without an error of its own: the
    nodes worth a reachability probe (a node that still answers lost its processes, not itself)."""
    nodes: dict[str, list[Peer]] = {}
    for peer in peers:
        nodes.setdefault(peer.node or peer.host, []).append(peer)
    return [ranks[0] for ranks in nodes.values()
            if all(p.rank in silent and p.rank not in errors for p in ranks)]


def unreachable_fault(peer: Peer, seen_from: str) -> NodeFault:
    """`peer`'s node did not answer from `seen_from`: it is down or cut off."""
    node = peer.node or peer.host
    return NodeFault(node, peer.rank, f"rank {peer.rank} stopped responding and {node} ({peer.address}) does not "
                                      f"answer from {seen_from}")

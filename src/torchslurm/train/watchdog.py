"""A dead peer never means a hang, and its death is reported root cause first.

    with torchslurm.init(timeout_s=60) as ctx, watchdog.Watchdog(ctx) as dog:
        with dog.guard():
            trainer.fit()

The bound comes from the process group's timeout (`torchslurm.init(timeout_s=...)`, 300 s by
default instead of torch's 30 min): a collective whose peer vanished fails within it — at once
when the peer's process died (the kernel closes its sockets: "Connection closed by peer"), after
the timeout when its node or network went away.

Such an error says little ("Timed out waiting 20000ms for recv operation", or a peer address).
So every rank also runs a heartbeat thread: a counter in the job's TCPStore, bumped every
`interval_s`. When a collective fails, `guard()` reads the counters twice, 2 × interval_s apart
(no clock comparison across nodes), and the ranks whose counter did not move are the root cause:
"rank 3 on node2 stopped responding". A rank that saw the failure says so in the store first: it
is alive even if it has finished its own diagnosis and exited before the reporter's second read.
When the store itself cannot be reached, its host (rank 0's, or under srun the first task's of the
master's node) is unreachable from here. The lowest rank that still answers reports the full
message; the others raise a one-line pointer to it, so the job log shows one explanation. The rank
that hosts the store waits (briefly) for the others' diagnoses before it exits with the store.

The watchdog never guesses and never ends a healthy run. On a loaded host (more ranks than CPUs)
the store answers slowly and heartbeats come late: a heartbeat that cannot start only logs a
warning; a silent rank whose process still runs on this host (same PID namespace), or any silent
rank while this rank's own store calls were failing, is reported as "could not tell", not as dead;
and a store that accepts connections but does not answer is "too slow", not "unreachable". The
timeouts are a `WatchdogTimeouts`, so tests can make them short.
"""

from __future__ import annotations

import faulthandler
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from torchslurm.errors import DistributedError
from torchslurm.train.badnodes import NodeFault, fault_of, own_error, silent_nodes, unreachable_fault
from torchslurm.train.diagnosis import Peer, diagnosis, first_sentence, silent_ranks, store_peer
from torchslurm.train.storecalls import STORE_TIMEOUT_S, read_counters, store_client, within

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

    from torchslurm.runtime.distributed import DistContext

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_INTERVAL_S = 1.0
HEARTBEAT_TIMEOUT_S = 10.0
"""How long one heartbeat store call may take: a loaded store answers late (a 1 s limit failed with
32 ranks on 2 CPUs). After a failure it reconnects only while rank 0's store still accepts
connections: a dead or cut-off store stays so."""
MAX_HEARTBEAT_RECONNECTS = 5
"""Consecutive failed heartbeats after which the heartbeat gives up even though the store answers."""
EXIT_DEADLINE_S = 15.0
"""After a failed collective the process is gone within this many seconds, whatever blocks: the
bound on a hang is the process group timeout + EXIT_DEADLINE_S."""
DIAGNOSIS_TIMEOUT_S = 2.0
"""Kept short: srun's --kill-on-bad-exit sends SIGKILL KillWait (30 s by default, man slurm.conf)
after its SIGTERM, and the requeue and the message must come out before that."""
_BEAT = "torchslurm/heartbeat/{}"
_FAILURE = "torchslurm/failure/{}"
"""Per rank: 1 once it saw a collective fail, 2 once its diagnosis is done."""
_ERROR = "torchslurm/error/{}"
"""Per rank: the error it stopped with (one line), when it was not a failed collective."""


@dataclass(frozen=True)
class WatchdogTimeouts:
    """The watchdog's limits on store calls (seconds)."""

    connect_s: float = STORE_TIMEOUT_S
    """Connecting the heartbeat's store client at start."""
    heartbeat_s: float = HEARTBEAT_TIMEOUT_S
    """One heartbeat store call."""
    diagnosis_s: float = DIAGNOSIS_TIMEOUT_S
    """One store call or connection probe of the diagnosis."""
    max_reconnects: int = MAX_HEARTBEAT_RECONNECTS
    """Consecutive failed heartbeats after which the heartbeat gives up although the store answers."""


class Watchdog:
    """Heartbeat thread + failure diagnosis for the current process group (see the module doc)."""

    def __init__(self, ctx: DistContext, interval_s: float = DEFAULT_INTERVAL_S,
                 bound_s: float | None = None, on_failure: Callable[[], None] | None = None, *,
                 on_node_fault: Callable[[Sequence[NodeFault]], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 timeouts: WatchdogTimeouts | None = None) -> None:
        self.ctx, self.interval_s = ctx, interval_s
        self.timeouts = timeouts or WatchdogTimeouts()
        self.store_trouble = 0
        """Store calls of this rank (heartbeat or start) that failed: then silence proves nothing."""
        self._sleep, self._clock = sleep, clock
        """How the diagnosis waits between two reads of the counters (the heartbeat thread waits on its
        own stop event)."""
        self.bound_s = bound_s
        """The process group timeout, quoted in the message (None: not quoted)."""
        self.on_failure = on_failure
        """Called once on a detected failure before raising (e.g. requeue the job)."""
        self.on_node_fault = on_node_fault
        """Called when a failure points at a node (train.badnodes): this rank's own CUDA or NCCL error, or a
        node found dead; e.g. requeue the job without it (Preemption.exclude_after_failure)."""
        self.faults: list[NodeFault] = []
        """The dead nodes the last diagnosis found."""
        self.peers: list[Peer] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _store(self, timeout_s: float = STORE_TIMEOUT_S) -> Store:
        return store_client(self.ctx, timeout_s)

    def start(self) -> None:
        """Gather every rank's host (one all_gather) and start the heartbeat."""
        import torch.distributed as dist

        me = Peer(self.ctx.rank, socket.gethostname(), _own_address(self.ctx.env.master_addr), os.getpid(),
                  _pid_namespace(), self.ctx.env.hosts_store, os.environ.get("SLURMD_NODENAME", ""))
        gathered: list[Peer | None] = [None] * self.ctx.world_size
        try:
            dist.all_gather_object(gathered, me)
        except RuntimeError as exc:
            raise DistributedError(
                f"rank {self.ctx.rank} on {me.host} could not exchange host names with the other ranks: "
                f"{first_sentence(str(exc))}.",
                "a peer died or the network between the nodes failed during start-up; read the first failing "
                "rank's log.", exit_code=1) from exc
        self.peers = [p for p in gathered if p is not None]
        connect_s = self.timeouts.connect_s
        try:
            store = within(connect_s, lambda: self._store(connect_s))
            within(connect_s, lambda: store.add(_BEAT.format(self.ctx.rank), 1))
        except Exception as exc:  # DistNetworkError/DistStoreError/OSError: a slow or overloaded store
            self.store_trouble += 1
            logger.warning("rank %d: the watchdog's heartbeat could not reach the store at %s:%d (%s); training goes "
                           "on, and a dead peer still ends the run within the process group timeout, but may not be "
                           "named", self.ctx.rank, self.ctx.env.master_addr, self.ctx.env.master_port,
                           first_sentence(str(exc)))
            return
        self._thread = threading.Thread(target=self._beat, args=(store,), name="torchslurm-heartbeat",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s)  # a daemon: may stay blocked on a dead store

    def __enter__(self) -> Watchdog:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, Exception) and not isinstance(exc, DistributedError):
            # This rank stops on an error of its own (a bad setting, a bug): the ranks that wait for
            # it in a collective say so instead of "stopped responding".
            summary = f"{type(exc).__name__}: {first_sentence(str(exc))}"[:300]
            self._ask_store(lambda store: store.set(_ERROR.format(self.ctx.rank), summary))
            self._node_fault(fault_of(self._node, self.ctx.rank, str(exc)))
        self.stop()

    @property
    def _node(self) -> str:
        me = self.peers[self.ctx.rank] if self.peers else None
        return (me.node or me.host) if me else os.environ.get("SLURMD_NODENAME", "") or socket.gethostname()

    def _node_fault(self, *faults: NodeFault | None) -> None:
        found = [f for f in faults if f is not None]
        if found and self.on_node_fault is not None:
            self.on_node_fault(found)

    def _beat(self, store: Store) -> None:
        key = _BEAT.format(self.ctx.rank)
        failures = 0
        while not self._stop.wait(self.interval_s):
            try:
                within(self.timeouts.heartbeat_s, functools.partial(store.add, key, 1))
                failures = 0
            except Exception:
                self.store_trouble += 1
                # A store that still accepts connections was only slow (a loaded host): a new client,
                # since a timed-out request leaves the old one out of step. Gone, cut off or failing
                # every time: the diagnosis says so, and reconnect attempts would each log a C++ stack
                # trace and load a store that is already slow.
                failures += 1
                if (failures > self.timeouts.max_reconnects or self.store_reachability() != "ok"
                        or self._stop.is_set()):
                    logger.debug("heartbeat of rank %d failed; it stops", self.ctx.rank, exc_info=True)
                    return
                logger.debug("heartbeat of rank %d timed out; reconnecting", self.ctx.rank, exc_info=True)
                try:
                    store = within(self.timeouts.heartbeat_s, lambda: self._store(self.timeouts.heartbeat_s))
                except Exception:
                    return

    def counters(self, key: str = _BEAT) -> dict[int, int] | None:
        """Every rank's count under `key` (its heartbeat by default), or None when the store cannot
        be reached."""
        ranks = [p.rank for p in self.peers]
        read = self._ask_store(lambda store: read_counters(store, [key.format(rank) for rank in ranks]))
        return None if read is None else dict(zip(ranks, read, strict=True))

    def _mark_failure_stage(self) -> None:
        """Tell the others that this rank saw the failure (first call) or finished its diagnosis."""
        self._ask_store(lambda store: store.add(_FAILURE.format(self.ctx.rank), 1))

    def _errors_of(self, ranks: Sequence[int]) -> dict[int, str]:
        """What those of `ranks` that stopped on an error of their own posted (see __exit__)."""
        def read(store: Store) -> dict[int, str]:
            keys = {rank: _ERROR.format(rank) for rank in ranks}
            return {rank: store.get(key).decode() for rank, key in keys.items() if store.check([key])}
        return self._ask_store(read) or {}

    def _ask_store(self, request: Callable[[Store], _T]) -> _T | None:
        if self.store_reachability() != "ok":  # a failed TCPStore() logs a C++ stack trace: avoid it
            return None
        try:
            return within(2 * self.timeouts.diagnosis_s, lambda: request(self._store(self.timeouts.diagnosis_s)))
        except Exception:  # connect/read timeouts surface as RuntimeError, DistStoreError, OSError
            return None

    def store_reachability(self) -> str:
        """'ok', 'refused' (rank 0's host answers, its store is gone: rank 0 died) or 'timeout'
        (the host does not answer: it, or this node, is cut off)."""
        return self._reachability(self.ctx.env.master_addr)

    def _reachability(self, address: str) -> str:
        """store_reachability for `address` at the store's port: on another host nothing listens there,
        so a live host refuses and only a dead or cut-off one lets the connection time out."""
        try:
            socket.create_connection((address, self.ctx.env.master_port), timeout=self.timeouts.diagnosis_s).close()
        except ConnectionRefusedError:
            return "refused"
        except OSError:
            return "timeout"
        return "ok"

    def diagnose(self, error: BaseException) -> tuple[DistributedError, bool]:
        """(the root-cause error, whether this rank is the one that reports it in full)."""
        me = self.peers[self.ctx.rank]
        self._mark_failure_stage()
        before = self.counters()
        self._sleep(2 * self.interval_s)
        after = self.counters() if before is not None else None
        stages = self.counters(_FAILURE) if after is not None else None
        silent = (None if before is None or after is None or stages is None
                  else silent_ranks(before, after, [rank for rank, stage in stages.items() if stage]))
        store = self.store_reachability() if silent is None else "ok"
        if (store == "ok" and silent is None) or (store == "timeout" and store_peer(self.peers).host == me.host):
            store = "slow"  # it takes connections (or is on this very host) but did not answer in time
        errors = self._errors_of(silent) if silent else {}
        unsure = [rank for rank in silent or () if rank not in errors and self._maybe_alive(self.peers[rank])]
        silent = None if silent is None else [rank for rank in silent if rank not in unsure]
        found = diagnosis(me, str(error), self.peers, silent, self.bound_s, store, errors, unsure)
        self.faults = [unreachable_fault(p, me.host) for p in silent_nodes(self.peers, silent or [], errors)
                       if self._reachability(p.address) == "timeout"]
        if silent is None and store == "timeout":
            self.faults.append(unreachable_fault(store_peer(self.peers), me.host))
        if silent is None:  # no store, no agreement: the lowest rank other than the store's on each host reports
            mine = [p.rank for p in self.peers if p.host == me.host and p is not store_peer(self.peers)]
            reporter = not mine or mine[0] == me.rank
        else:
            alive = [p.rank for p in self.peers if p.rank not in silent and p.rank not in unsure]
            reporter = bool(alive) and alive[0] == me.rank
        return found, reporter

    def _maybe_alive(self, peer: Peer) -> bool:
        """Whether a rank without a recent heartbeat may still be alive: its process runs here, or
        this rank's own store calls failed (heartbeats are then late everywhere)."""
        me = self.peers[self.ctx.rank]
        if peer.pid and peer.host == me.host and peer.pid_namespace and peer.pid_namespace == me.pid_namespace:
            return _running(peer.pid)
        return self.store_trouble > 0

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Turn a failed collective into one DistributedError that names the root cause."""
        try:
            yield
        except RuntimeError as exc:  # DistBackendError and Gloo's errors are RuntimeErrors
            if own_error(str(exc)):
                raise  # this rank's own CUDA error: __exit__ names it to the others, who diagnose
            # The last resort of "never hang": if requeue, diagnosis or the teardown of a process
            # group with dead peers blocks, exit anyway, with every thread's stack on stderr. A C
            # thread: it fires even while a blocked call holds the GIL.
            faulthandler.dump_traceback_later(EXIT_DEADLINE_S, exit=True)
            logger.info("rank %d: a collective failed (%s); looking for the root cause", self.ctx.rank,
                        first_sentence(str(exc)))
            # Requeue first (srun may SIGKILL us during the diagnosis), but not from a node cut off
            # from rank 0's host: Slurm is likely out of reach too, and the other side requeues.
            if self.on_failure is not None and self.store_reachability() != "timeout":
                self.on_failure()
            found, reporter = self.diagnose(exc)
            self._mark_failure_stage()
            self._node_fault(fault_of(self._node, self.ctx.rank, str(exc)), *(self.faults if reporter else ()))
            if self.ctx.env.hosts_store:
                self._wait_for_the_others_diagnoses()
            if reporter:
                raise found from exc
            raise DistributedError(
                f"rank {self.ctx.rank} on {socket.gethostname()} stopped because a peer failed; the root cause "
                "is in the message of the lowest rank still running.",
                "look for 'stopped responding' or 'unreachable' in the job log.", exit_code=1) from exc

    def _wait_for_the_others_diagnoses(self) -> None:
        """Keep the store up (this rank hosts it) until every rank still alive has diagnosed (bounded)."""
        deadline = self._clock() + 2 * self.interval_s + 2 * self.timeouts.diagnosis_s
        while self._clock() < deadline:
            before = self.counters()
            stages = self.counters(_FAILURE)
            self._sleep(self.interval_s)
            after = self.counters()
            if before is None or stages is None or after is None:
                return
            undecided = [rank for rank in range(self.ctx.world_size)
                         if stages[rank] < 2 and after[rank] != before[rank]]
            if not undecided:
                return


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _own_address(master: str) -> str:
    """The local address this host uses to reach the master (UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((master, 9))
            return str(sock.getsockname()[0])
    except OSError:
        return "?"

"""One run at a time in a checkpoints folder: rank 0, the one writer of its names, holds a lock file
there while it trains. Two runs in one run_dir would delete each other's staging folders and prune
each other's checkpoints; the second gets an error naming the first (host, pid, Slurm job) instead.

The lock file holds its holder as JSON and is made whole before it appears (a file of its own,
hard-linked under the lock's name: link(2) fails if the name exists, also over NFS, where O_EXCL
was long unreliable). The holder touches it every HEARTBEAT_S. A lock counts as stale, and is taken
over, when (`stale`, pure):
  - its process is gone, on this host (a crash, kill -9, a torchrun restart of the ranks);
  - it belongs to this same Slurm job, on another host (a requeued job, or a restart elsewhere);
  - its heartbeat stopped STALE_AFTER_S ago (its node died, its job ended).
Taking over renames nothing: the stale file is first hard-linked to a name of its own, so that of
several runs judging it stale at once only one removes it, and never a newer lock instead.
Torch-free.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from torchslurm.errors import CheckpointError
from torchslurm.jobs.rundir import job_of
from torchslurm.runtime.safefiles import open_new
from torchslurm.train.checkpoint.layout import LOCK

logger = logging.getLogger(__name__)

HEARTBEAT_S = 30.0
"""How often the holder touches its lock."""
STALE_AFTER_S = 600.0
"""A lock untouched this long counts as left by a run that is gone (a dead node keeps no process to
ask about). Far above HEARTBEAT_S: NFS caches another host's file times for up to a minute."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or wants) a lock."""

    host: str
    pid: int
    job: str | None
    """The Slurm job id (an array task's own), None outside Slurm."""
    since: float
    """When it was taken (seconds since the epoch)."""
    token: str
    """A random name of this holding."""
    process_start: str | None = None
    """The process's start time as /proc says it (tells a reused pid from the holder)."""

    def describe(self) -> str:
        job = f", Slurm job {self.job}" if self.job else ""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"host {self.host}, pid {self.pid}{job}, since {since}"

    @classmethod
    def from_json(cls, text: str) -> Holder | None:
        try:
            data = json.loads(text)
            holder = cls(str(data["host"]), int(data["pid"]), None if data.get("job") is None else str(data["job"]),
                         float(data["since"]), str(data["token"]), data.get("process_start"))
        except (ValueError, KeyError, TypeError):
            return None
        return holder


@dataclass(frozen=True)
class Seen:
    """A lock found in place: its holder (None: unreadable), how long since its last heartbeat, and
    whether its process lives (on this host; None on another)."""

    holder: Holder | None
    age_s: float
    alive: bool | None


def me(environ: Mapping[str, str], clock: Callable[[], float] = time.time) -> Holder:
    """This process as a lock's holder."""
    return Holder(socket.gethostname(), os.getpid(), job_of(environ) or None, clock(), secrets.token_hex(8),
                  process_start(os.getpid()))


def stale(seen: Seen, me: Holder, stale_after_s: float = STALE_AFTER_S) -> str | None:
    """Why the lock `seen` no longer holds (a sentence), or None while its holder runs."""
    held = seen.holder
    if held is not None and held.host == me.host and seen.alive is False:
        return f"its process {held.pid} on {held.host} is gone"
    if held is not None and held.job and held.job == me.job and held.host != me.host:
        return f"it was taken by this same Slurm job {held.job} on {held.host}, now restarted here"
    if seen.age_s > stale_after_s:
        return f"its heartbeat stopped {seen.age_s:.0f} s ago"
    return None


def busy(root: Path, seen: Seen, path: Path) -> CheckpointError:
    who = seen.holder.describe() if seen.holder else "a holder whose lock file cannot be read"
    return CheckpointError(
        f"{root} is in use by another run ({who}); two runs in one run_dir would delete each other's "
        "checkpoints.",
        f"wait for that run to end, or give this one another run_dir. If it is gone, its lock counts as stale "
        f"{STALE_AFTER_S / 60:.0f} minutes after its last heartbeat, or remove {path} yourself.")


class Lock:
    """A lock held by this process: touched every HEARTBEAT_S by a thread until `release()`."""

    def __init__(self, path: Path, holder: Holder, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.path, self.holder = path, holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_s,), name="torchslurm-lock", daemon=True)
        self._thread.start()

    def _beat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            if not self.held():
                logger.warning("%s was taken over by another run; this run no longer owns its run_dir", self.path)
                return
            try:
                os.utime(self.path, follow_symlinks=False)
            except OSError as exc:  # a file system hiccup: the next beat tries again
                logger.debug("heartbeat of %s failed: %s", self.path, exc)

    def held(self) -> bool:
        found = _read(self.path)
        return found is not None and found.token == self.holder.token

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.held():
            self.path.unlink(missing_ok=True)


def acquire(root: Path, holder: Holder, *, stale_after_s: float = STALE_AFTER_S, heartbeat_s: float = HEARTBEAT_S,
            clock: Callable[[], float] = time.time) -> Lock:
    """The lock of `root` for `holder`, taking over a stale one; CheckpointError naming the holder
    when another run holds it."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK
    for _ in range(5):
        if _create(path, holder):
            return Lock(path, holder, heartbeat_s)
        seen = look(path, holder, clock)
        if seen is None:  # released meanwhile
            continue
        reason = stale(seen, holder, stale_after_s)
        if reason is None:
            raise busy(root, seen, path)
        logger.warning("taking over %s: %s", path, reason)
        _remove(path, seen)
    raise CheckpointError(f"{path} could not be taken: other runs kept taking it at the same time.",
                          "start one run per run_dir.")


def look(path: Path, me: Holder, clock: Callable[[], float] = time.time) -> Seen | None:
    """The lock at `path` as found now; None when there is none."""
    try:
        mtime = path.lstat().st_mtime
    except FileNotFoundError:
        return None
    held = _read(path)
    alive = None
    if held is not None and held.host == me.host:
        started = process_start(held.pid)
        alive = started is not None and (held.process_start is None or started == held.process_start)
    return Seen(held, max(0.0, clock() - mtime), alive)


def process_start(pid: int) -> str | None:
    """The start time of process `pid` (field 22 of /proc/PID/stat), None when there is no such
    process; without /proc, "?" for a process that exists."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        if not os.path.isdir("/proc/self"):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            except PermissionError:
                pass
            return "?"
        return None
    except (OSError, IndexError):
        return None


def _create(path: Path, holder: Holder) -> bool:
    """Put `holder`'s lock at `path`, whole; False when a lock is there."""
    staging = path.with_name(f"{path.name}.{holder.token}.tmp")
    with open_new(staging) as out:
        out.write(json.dumps(asdict(holder)) + "\n")
    try:
        os.link(staging, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: O_EXCL, whose readers may see it empty a moment
        try:
            with open_new(path) as out:
                out.write(json.dumps(asdict(holder)) + "\n")
            return True
        except FileExistsError:
            return False
    finally:
        staging.unlink(missing_ok=True)


def _remove(path: Path, seen: Seen) -> None:
    """Remove the stale lock `seen` at `path`, unless another run removed it (or replaced it) first."""
    token = seen.holder.token if seen.holder else "unreadable"
    aside = path.with_name(f"{path.name}.stale-{token}")
    try:
        os.link(path, aside)  # only one of several runs taking it over gets this name
    except FileExistsError:
        return
    except FileNotFoundError:
        return
    except OSError:  # no hard links: remove it, racing whoever else judged it stale
        path.unlink(missing_ok=True)
        return
    try:
        found = _read(aside)
        if (found.token if found else "unreadable") == token:  # the lock judged stale, not a newer one
            path.unlink(missing_ok=True)
    finally:
        aside.unlink(missing_ok=True)


def _read(path: Path) -> Holder | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as source:
            return Holder.from_json(source.read(4096))
    except OSError:
        return None

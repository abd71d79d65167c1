"""`torchslurm stacks`: every rank answers a request for its stacks through files, without stopping.

Each rank runs one daemon thread (started by `torchslurm.init()`) that watches folders: the job's
folder `~/.torchslurm/jobs/<job id>` under Slurm, `init(run_dir=...)` and the Trainer's run_dir.
In each it keeps `.torchslurm-stacks/rank-NNNNN.json` (who it is: host, pid, world size) and reads
`.torchslurm-stacks/request` once per `POLL_S`. `torchslurm stacks` writes a new request id there;
each rank answers by rewriting its own file with the id and its stacks (stackdump.snapshot), and the
command groups what came back (stackreport).

Why files: the home folder (and a run_dir on a shared file system) is what a login node and the
job's nodes share on a Slurm cluster; the job's store port need not be reachable from the login
node, and the preemption signals (USR1/USR2/TERM) stay the preemption's. Every file is created once
and later rewritten in place, never renamed: NFS's close-to-open consistency then shows a reader
the new content at its next open(), whereas a path that did not exist may be cached as absent.
Cost for the ranks: one open() and a read of a few bytes per folder per second, in a thread that
sleeps otherwise; a snapshot only on request. Torch-free.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from torchslurm.errors import TorchSlurmError
from torchslurm.runtime.safefiles import open_append, open_write
from torchslurm.runtime.stackdump import RankStack, snapshot

logger = logging.getLogger(__name__)

FOLDER = ".torchslurm-stacks"
"""The folder of requests and answers inside a watched folder."""
REQUEST = "request"
POLL_S = 1.0
"""How often a rank reads the request file: `torchslurm stacks` answers within POLL_S + its wait."""


def job_dir(job_id: str, home: Path) -> Path:
    """The folder every rank of Slurm job `job_id` watches (the same path on the login node)."""
    return home / ".torchslurm" / "jobs" / job_id


def rank_file(folder: Path, rank: int) -> Path:
    return folder / FOLDER / f"rank-{rank:05d}.json"


def _write(path: Path, text: str) -> None:
    """Rewrite `path` in place (see the module doc: no rename)."""
    with open_write(path) as out:
        out.write(text)


def _read(path: Path) -> str:
    try:
        with open(path) as source:
            return source.read()
    except OSError:
        return ""


class StackWatch:
    """This rank's responder: a daemon thread answering stack requests in its folders."""

    def __init__(self, rank: int, world_size: int, collectives: Callable[[], int | None] = lambda: None,
                 poll_s: float = POLL_S) -> None:
        self.rank, self.world_size, self.poll_s = rank, world_size, poll_s
        self._collectives = collectives
        self._answered: dict[Path, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.steps: int | None = None
        """Steps finished (the Trainer sets it): shown in each answer."""

    @property
    def folders(self) -> list[Path]:
        with self._lock:
            return list(self._answered)

    def add(self, folder: Path) -> bool:
        """Watch `folder` too (created if missing); False when it cannot be written (logged)."""
        folder = Path(folder).absolute()
        try:
            (folder / FOLDER).mkdir(parents=True, exist_ok=True)
            with open_append(folder / FOLDER / REQUEST):  # created if missing, never truncated
                pass
            _write(rank_file(folder, self.rank), json.dumps(self._whoami(None)))
        except (OSError, TorchSlurmError) as exc:
            logger.debug("rank %d: `torchslurm stacks` cannot reach this rank through %s: %s", self.rank, folder, exc)
            return False
        with self._lock:
            self._answered.setdefault(folder, "")
        return True

    def _whoami(self, request: str | None) -> dict[str, object]:
        return {"rank": self.rank, "world_size": self.world_size, "host": socket.gethostname(), "pid": os.getpid(),
                "request": request}

    def start(self) -> StackWatch:
        self._thread = threading.Thread(target=self._loop, name="torchslurm-stacks", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering and remove this rank's files (the job no longer runs here)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 1)
        for folder in self.folders:
            with contextlib.suppress(OSError):
                rank_file(folder, self.rank).unlink()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            for folder in self.folders:
                try:
                    self.answer(folder)
                except Exception:  # a full disk, a folder removed: never the training's problem
                    logger.debug("rank %d: stack request in %s failed", self.rank, folder, exc_info=True)

    def answer(self, folder: Path) -> bool:
        """Answer a new request in `folder`, if there is one."""
        request = _read(folder / FOLDER / REQUEST).strip()
        with self._lock:
            if not request or request == self._answered.get(folder):
                return False
            self._answered[folder] = request
        stack = snapshot(self.rank, self.world_size, self._collectives(), self.steps,
                         skip_thread=threading.get_ident())
        answer = {**self._whoami(request), "stack": json.loads(stack.to_json())}
        _write(rank_file(folder, self.rank), json.dumps(answer))
        return True


# ---- the asking side (`torchslurm stacks`) ---------------------------------------------------------

def ask(folder: Path, clock: Callable[[], float] = time.time) -> str:
    """Write a new request id into `folder`'s request file; the id."""
    request = f"{clock():.6f}-{os.getpid()}"
    _write(folder / FOLDER / REQUEST, request + "\n")
    return request


def registered(folder: Path) -> dict[int, dict[str, object]]:
    """Every rank file in `folder` (rank -> its content), whatever request it answered."""
    found: dict[int, dict[str, object]] = {}
    for path in sorted((folder / FOLDER).glob("rank-*.json")):
        with contextlib.suppress(ValueError, KeyError):
            data = json.loads(_read(path))
            found[int(data["rank"])] = data
    return found


def answers(folder: Path, request: str) -> dict[int, RankStack]:
    """The stacks of the ranks that answered `request` so far (a file half rewritten counts as not yet)."""
    return {rank: RankStack.from_json(json.dumps(data["stack"])) for rank, data in registered(folder).items()
            if data.get("request") == request and "stack" in data}


def collect(folder: Path, wait_s: float, sleep: Callable[[float], None] = time.sleep,
            clock: Callable[[], float] = time.monotonic) -> tuple[dict[int, RankStack], int]:
    """Ask, then wait up to `wait_s` for every registered rank; (the answers, the world size)."""
    request = ask(folder)
    deadline = clock() + wait_s
    while True:
        known = registered(folder)
        world = max((int(str(d.get("world_size", 0))) for d in known.values()), default=0)
        got = answers(folder, request)
        if (world and len(got) >= world) or clock() >= deadline:
            return got, world
        sleep(0.2)


def watching(folders: Iterable[Path]) -> list[Path]:
    """Those of `folders` that some rank watches (they hold the request file)."""
    return [f for f in folders if (f / FOLDER / REQUEST).is_file()]

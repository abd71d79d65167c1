"""A live hang is reported with every rank's stack, long before the process group timeout ends it.

    detector = HangDetector(ctx, timeout_s=0, action="exit", run_dir=run_dir)
    with detector:
        for batch in data:
            ...
            detector.step_done()

Every rank runs a daemon thread that ticks (about once a second) and adds 1 to one shared progress
counter in the job's TCPStore when this rank finished a step since its last tick (0 otherwise, a
read). A Python thread runs while the main thread waits in a C call that released the GIL (torch's
collectives, a DataLoader's queue, a lock, a sleep). When the counter has not moved for the hang
timeout (on this rank's own clock: no clock comparison across nodes), the rank posts a trigger key;
every rank whose counter stalled checks for it at each tick. Then each rank posts its stack
(stackdump.snapshot, with its count of issued collectives) into the store; the lowest rank that
posted waits briefly for the others, writes one grouped report (stackreport) to the job log and to
run_dir/hang-report.txt, every rank's full stacks to run_dir/hang-stacks.json, and then, as the
action says, every rank exits with code 1 after one requeue (as after a failed collective), or the
ranks keep waiting and report again once steps moved and stalled again.

Cost when healthy: one store add per rank per tick, off the training thread, and two attribute
updates per step on it (benchmarks/hang_overhead.py).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from torchslurm.errors import ConfigError, TorchSlurmError
from torchslurm.runtime.safefiles import open_append, replace
from torchslurm.runtime.stackdump import RankStack, snapshot
from torchslurm.runtime.stackreport import format_groups
from torchslurm.train.storecalls import store_client

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

    from torchslurm.runtime.distributed import DistContext

logger = logging.getLogger(__name__)

FLOOR_S = 60.0
"""The derived timeout is never shorter: a first epoch's compile, a slow validation or a checkpoint
write are not hangs."""
STEP_FACTOR = 20
"""The derived timeout is this many median steps (when above the floor)."""
BELOW_GROUP_TIMEOUT = 0.8
"""A derived timeout stays below this share of the process group timeout: the report must come before
the collectives time out."""
HANG_EXIT_CODE = 1
"""A rank's exit code after a hang report with action exit (a failed collective's, too)."""
REPORT_FILE = "hang-report.txt"
STACKS_FILE = "hang-stacks.json"
_PROGRESS = "torchslurm/hang/progress"
_TRIGGER = "torchslurm/hang/{}/trigger"
_STACK = "torchslurm/hang/{}/stack/{}"
_POSTED = "torchslurm/hang/{}/posted"
_REPORTED = "torchslurm/hang/{}/reported"
_EXITED = "torchslurm/hang/{}/exited"
_REQUEUED = "torchslurm/hang/{}/requeued"
REQUEUE_WAIT_S = 15.0
"""How long the other ranks wait for the reporter's requeue before they exit: the first rank to exit
ends the srun step (--kill-on-bad-exit), which would kill the reporter in the middle of it."""


def hang_timeout(configured_s: float, step_times_s: Sequence[float], group_timeout_s: float) -> float | None:
    """Seconds without progress that make a hang: `configured_s` when positive; else derived,
    max(FLOOR_S, STEP_FACTOR x the median step) capped below the group timeout, or None while no
    step has finished (start-up is bounded by the group timeout alone)."""
    if configured_s > 0:
        return configured_s
    if not step_times_s:
        return None
    derived = max(FLOOR_S, STEP_FACTOR * statistics.median(step_times_s))
    return min(derived, BELOW_GROUP_TIMEOUT * group_timeout_s)


def timeout_problem(configured_s: float, group_timeout_s: float) -> ConfigError | None:
    """A configured timeout must end before the process group timeout does (else the collectives
    fail first and no report is made)."""
    if configured_s < group_timeout_s:
        return None
    return ConfigError(f"hang_timeout_s={configured_s:g} but the process group timeout is {group_timeout_s:g} s; "
                       "a hang is reported only when it ends before the collectives time out.",
                       f"set hang_timeout_s below {group_timeout_s:g} (or 0 to derive it from the step times), or "
                       "raise torchslurm.init(timeout_s=...).")


def tick_for(configured_s: float, group_timeout_s: float) -> float:
    """How often the thread looks: a tenth of the shortest timeout possible, within [0.1 s, 1 s]."""
    shortest = configured_s if configured_s > 0 else min(FLOOR_S, BELOW_GROUP_TIMEOUT * group_timeout_s)
    return min(1.0, max(0.1, shortest / 10))


class HangDetector:
    """The hang detector of one rank (see the module doc)."""

    def __init__(self, ctx: DistContext, timeout_s: float, action: str, run_dir: Path,
                 on_hang: Callable[[], None] | None = None, *, exit: Callable[[int], None] = os._exit) -> None:
        ConfigError.raise_any([timeout_problem(timeout_s, ctx.timeout_s) if timeout_s > 0 else None])
        self.ctx, self.configured_s, self.action, self.run_dir = ctx, timeout_s, action, Path(run_dir)
        self.on_hang, self._exit = on_hang, exit
        self.tick_s = tick_for(timeout_s, ctx.timeout_s)
        self.steps = 0
        """Steps finished by this rank (the training thread bumps it)."""
        self._beats = 0
        self._paused = 0
        self._last_step = time.monotonic()
        self._step_times: deque[float] = deque(maxlen=200)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reports: list[str] = []
        """The reports this rank wrote (the reporter's)."""

    # ---- the training thread's side: plain attribute updates ------------------------------------------
    def step_done(self) -> None:
        """A step finished on this rank."""
        now = time.monotonic()
        self._step_times.append(now - self._last_step)
        self._last_step = now
        self.steps += 1

    def beat(self) -> None:
        """Work that is not a step went on (a validation batch): progress, not a step time."""
        self._beats += 1
        self._last_step = time.monotonic()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Long work that is not a step (a checkpoint save): counted as progress while it lasts."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            self._last_step = time.monotonic()

    # ---- the thread ----------------------------------------------------------------------------------
    def start(self) -> HangDetector:
        try:
            store = store_client(self.ctx, timeout_s=30.0)
        except Exception as exc:  # a slow store: training goes on, the group timeout still bounds a hang
            logger.warning("rank %d: the hang detector could not reach the store (%s); hangs end at the process "
                           "group timeout without a report", self.ctx.rank, exc)
            return self
        self._thread = threading.Thread(target=self._run, args=(store,), name="torchslurm-hang", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.tick_s + 1)

    def __enter__(self) -> HangDetector:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self, store: Store) -> None:
        try:
            self._watch(store)
        except Exception:  # the store went away (the run ends, a peer died: the watchdog's case)
            logger.debug("rank %d: hang detector stops", self.ctx.rank, exc_info=True)

    def _watch(self, store: Store) -> None:
        seen_work, seen_value, changed_at = -1, -1, time.monotonic()
        episode, armed = 0, True
        while not self._stop.wait(self.tick_s):
            work = self.steps + self._beats
            moved = work != seen_work or self._paused > 0
            seen_work = work
            value = int(store.add(_PROGRESS, 1 if moved else 0))
            now = time.monotonic()
            if value != seen_value:
                seen_value, changed_at, armed = value, now, True
                continue
            if not armed:
                continue
            limit = hang_timeout(self.configured_s, list(self._step_times), self.ctx.timeout_s)
            if store.check([_TRIGGER.format(episode + 1)]):
                episode += 1
            elif limit is not None and now - changed_at >= limit:
                episode += 1
                store.add(_TRIGGER.format(episode), 1)
                logger.debug("rank %d: no step for %.1f s (hang_timeout_s %.1f)", self.ctx.rank, now - changed_at,
                             limit)
            else:
                continue
            self._dump(store, episode, now - changed_at, limit)
            armed = False  # action wait: the next report comes after progress and another stall

    def _dump(self, store: Store, episode: int, stalled_s: float, limit: float | None) -> None:
        from torchslurm.runtime.distributed import collectives_issued

        rank, world = self.ctx.rank, self.ctx.world_size
        started = time.monotonic()
        mine = snapshot(rank, world, collectives_issued(), self.steps, skip_thread=threading.get_ident())
        store.set(_STACK.format(episode, rank), mine.to_json())
        store.add(_POSTED.format(episode), 1)
        window = max(2.0, 3 * self.tick_s)
        deadline = time.monotonic() + window
        while time.monotonic() < deadline and int(store.add(_POSTED.format(episode), 0)) < world:
            time.sleep(0.1)
        lower = next((r for r in range(rank) if store.check([_STACK.format(episode, r)])), None)
        if lower is None:
            self._report(store, episode, stalled_s + time.monotonic() - started, limit)
            store.set(_REPORTED.format(episode), "1")
        else:
            waited = time.monotonic() + window + 10.0
            while time.monotonic() < waited and not store.check([_REPORTED.format(episode)]):
                time.sleep(0.1)
        if self.action == "exit":
            self._leave(store, episode, reporter=lower is None)

    def _report(self, store: Store, episode: int, waited_s: float, limit: float | None) -> None:
        """Group the posted stacks and write the report; `waited_s`: from the last progress seen to now."""
        stacks: dict[int, RankStack] = {}
        for rank in range(self.ctx.world_size):
            key = _STACK.format(episode, rank)
            if store.check([key]):
                stacks[rank] = RankStack.from_json(store.get(key).decode())
        text = hang_report(stacks, self.ctx.world_size, waited_s, limit, self.run_dir, self.action)
        self.reports.append(text)
        logger.error("%s", text)
        try:
            with open_append(self.run_dir / REPORT_FILE) as out:  # hang_action=wait: one report per hang
                out.write(text + "\n\n")
            replace(self.run_dir / STACKS_FILE,
                    json.dumps({str(r): json.loads(s.to_json()) for r, s in stacks.items()}, indent=1) + "\n")
        except (OSError, TorchSlurmError) as exc:
            logger.warning("the hang report could not be written to %s: %s", self.run_dir, exc)

    def _leave(self, store: Store, episode: int, reporter: bool) -> None:
        """Requeue once (the reporter), let the store's host go last, and exit."""
        if reporter:
            if self.on_hang is not None:
                self.on_hang()
            store.add(_REQUEUED.format(episode), 1)
        else:
            deadline = time.monotonic() + REQUEUE_WAIT_S
            while time.monotonic() < deadline and int(store.add(_REQUEUED.format(episode), 0)) < 1:
                time.sleep(0.1)
        store.add(_EXITED.format(episode), 1)
        if self.ctx.env.hosts_store:  # the others still read the store: leave last (bounded)
            posted = int(store.add(_POSTED.format(episode), 0))
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and int(store.add(_EXITED.format(episode), 0)) < posted:
                time.sleep(0.1)
        for handler in logging.getLogger().handlers + logging.getLogger("torchslurm").handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        self._exit(HANG_EXIT_CODE)


def hang_report(stacks: dict[int, RankStack], world_size: int, stalled_s: float, limit: float | None, run_dir: Path,
                action: str) -> str:
    """The text of a hang report: the headline, the grouped stacks, where the full stacks are."""
    how = f"hang_timeout_s={limit:g}" if limit is not None else "hang_timeout_s"
    then = ("every rank exits now (code 1, requeued as after a failure)" if action == "exit"
            else "the ranks keep waiting (hang_action=wait)")
    return "\n".join([
        f"hang: no rank finished a step for {stalled_s:.1f} s ({how}); where each rank's main thread is, "
        "innermost call first:",
        format_groups(stacks, world_size),
        f"every thread's full stack: {run_dir / STACKS_FILE}; {then}.",
    ])


class Idle:
    """No hang detection (one rank, or hang_action=off): the training thread's calls do nothing."""

    def step_done(self) -> None:
        pass

    def beat(self) -> None:
        pass

    @contextmanager
    def paused(self) -> Iterator[None]:
        yield

    def __enter__(self) -> Idle:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def hang_watch(ctx: DistContext | None, timeout_s: float, action: str, run_dir: Path,
               on_hang: Callable[[], None] | None = None) -> HangDetector | Idle:
    """The detector for a run: idle for one rank or hang_action=off."""
    if ctx is None or ctx.world_size == 1 or action == "off":
        return Idle()
    return HangDetector(ctx, timeout_s, action, run_dir, on_hang=on_hang)

"""The watchdog: the heartbeat against a real store, the reporter's reads, rank 0 keeping its store."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from torchslurm.train.diagnosis import Peer
from torchslurm.train.watchdog import Watchdog

CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
          "[198.18.0.12]:41234. This is typically caused by a remote worker crashing. GLHF!")
TIMEOUT = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms for recv operation"


class _SlowStore:
    """A store client whose every add times out, as on a loaded store host."""

    def __init__(self) -> None:
        self.calls = 0

    def add(self, key: str, amount: int) -> int:
        self.calls += 1
        raise RuntimeError("Socket Timeout")


def _heartbeat_against(store_port: int, reconnects_slow: bool = False) -> tuple[Watchdog, threading.Thread, _SlowStore]:
    import torch

    from torchslurm.runtime.distenv import detect
    from torchslurm.runtime.distributed import DistContext

    env = detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(store_port)})
    dog = Watchdog(DistContext(env, torch.device("cpu"), "gloo", {}), interval_s=0.05)
    slow = _SlowStore()
    if reconnects_slow:
        dog._store = lambda timeout_s=0.0: slow  # type: ignore[method-assign,assignment]
    beat = threading.Thread(target=dog._beat, args=(slow,), daemon=True)
    beat.start()
    return dog, beat, slow


def test_a_heartbeat_that_timed_out_reconnects_while_the_store_still_answers() -> None:
    from torch.distributed import PrefixStore, TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    dog, beat, slow = _heartbeat_against(server.port)
    try:
        beats = PrefixStore(dog.ctx.store_prefix, server)  # what the diagnosis reads
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and int(beats.add("torchslurm/heartbeat/1", 0)) < 3:
            time.sleep(0.05)
        assert slow.calls == 1 and int(beats.add("torchslurm/heartbeat/1", 0)) >= 3 and beat.is_alive()
    finally:
        dog.stop()
        beat.join(timeout=30)
    assert not beat.is_alive()


def test_a_heartbeat_whose_store_is_gone_stops() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        _, beat, slow = _heartbeat_against(port)
        beat.join(timeout=30)
    assert slow.calls == 1 and not beat.is_alive()


def test_a_heartbeat_that_fails_every_time_although_the_store_answers_gives_up() -> None:
    from torch.distributed import TCPStore

    from torchslurm.train.watchdog import MAX_HEARTBEAT_RECONNECTS

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    _, beat, slow = _heartbeat_against(server.port, reconnects_slow=True)  # every new client is slow too
    beat.join(timeout=30)
    assert not beat.is_alive() and slow.calls == MAX_HEARTBEAT_RECONNECTS + 1




def _rank0_watchdog_on_a_real_store(world_size: int, **waits: Any) -> tuple[Watchdog, Any, Any]:
    """Rank 0's watchdog (heartbeat running), the store server and the run's view of it, as if
    start() had gathered the peers. `waits`: the watchdog's sleep and clock, when faked."""
    import torch
    from torch.distributed import PrefixStore, TCPStore

    from torchslurm.runtime.distenv import detect
    from torchslurm.runtime.distributed import DistContext

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = detect({"RANK": "0", "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(server.port)})
    dog = Watchdog(DistContext(env, torch.device("cpu"), "gloo", {}), interval_s=0.2, **waits)
    dog.peers = [Peer(rank, "node1", "127.0.0.1") for rank in range(world_size)]
    threading.Thread(target=dog._beat, args=(dog._store(),), daemon=True).start()
    return dog, server, PrefixStore(dog.ctx.store_prefix, server)


def test_a_peer_that_diagnosed_and_exited_during_the_reporters_reads_is_not_named() -> None:
    dog, _server, store = _rank0_watchdog_on_a_real_store(3)
    try:
        store.add("torchslurm/failure/1", 1)  # rank 1 saw the failure; its heartbeat has stopped (it exited)
        found, reporter = dog.diagnose(RuntimeError(CLOSED))
    finally:
        dog.stop()
    assert str(found).startswith("rank 2 on node1 (127.0.0.1) stopped responding") and reporter


class _DictStore:
    """The store calls the diagnosis makes, in memory (a real TCPStore round trip costs ~40 ms here)."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def add(self, key: str, amount: int) -> int:
        self.values[key] = self.values.get(key, 0) + amount
        return self.values[key]

    def check(self, keys: list[str]) -> bool:
        return all(key in self.values for key in keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [str(self.values[key]).encode() for key in keys]


class _PeerPlayedBySleep:
    """A fake clock whose sleep plays rank 1: alive and diagnosing (its heartbeat moves) for the
    first `busy` waits, then done (its failure stage becomes 2). No real time passes."""

    def __init__(self, busy: int) -> None:
        self.store, self.busy, self.now, self.waits = _DictStore(), busy, 0.0, 0

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.waits += 1
        if self.waits <= self.busy:
            self.store.add("torchslurm/heartbeat/1", 1)
        elif self.waits == self.busy + 1:
            self.store.add("torchslurm/failure/1", 1)

    def clock(self) -> float:
        return self.now


def test_rank_0_keeps_its_store_until_a_live_peer_has_diagnosed() -> None:
    """It returns at the first read after the peer's diagnosis is done, not before, not later."""
    peer = _PeerPlayedBySleep(busy=4)
    dog, _server, _ = _rank0_watchdog_on_a_real_store(2, sleep=peer.sleep, clock=peer.clock)
    store = peer.store
    dog._store = lambda timeout_s=0.0: store  # type: ignore[method-assign,assignment]
    store.add("torchslurm/failure/0", 2)  # rank 0 has diagnosed: guard() marks both stages before waiting
    store.add("torchslurm/failure/1", 1)  # rank 1 saw the failure and is diagnosing
    try:
        dog._wait_for_the_others_diagnoses()
    finally:
        dog.stop()
    assert peer.waits == 5 and store.values["torchslurm/failure/1"] == 2


def test_rank_0_waits_for_a_peer_that_never_finishes_only_until_its_deadline() -> None:
    from torchslurm.train.watchdog import DIAGNOSIS_TIMEOUT_S

    peer = _PeerPlayedBySleep(busy=10_000)
    dog, _server, _ = _rank0_watchdog_on_a_real_store(2, sleep=peer.sleep, clock=peer.clock)
    store = peer.store
    dog._store = lambda timeout_s=0.0: store  # type: ignore[method-assign,assignment]
    store.add("torchslurm/failure/0", 2)
    store.add("torchslurm/failure/1", 1)
    try:
        dog._wait_for_the_others_diagnoses()
    finally:
        dog.stop()
    bound = 2 * dog.interval_s + 2 * DIAGNOSIS_TIMEOUT_S
    assert bound <= peer.now < bound + dog.interval_s + 1e-9


def test_the_error_a_peer_exits_with_reaches_the_reporter_through_the_store() -> None:
    import torch

    from torchslurm.errors import ConfigError
    from torchslurm.runtime.distenv import detect
    from torchslurm.runtime.distributed import DistContext

    dog, server, _ = _rank0_watchdog_on_a_real_store(2)
    env = detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(server.port)})
    peer = Watchdog(DistContext(env, torch.device("cpu"), "gloo", {}), interval_s=0.2)
    error = ConfigError("amp=fp16 on device cpu: fp16 with GradScaler needs CUDA.", hint="use amp=bf16")
    try:
        peer.__exit__(ConfigError, error, None)  # rank 1 leaves its Watchdog on that error (never beat)
        found, reporter = dog.diagnose(RuntimeError(CLOSED))
    finally:
        dog.stop()
    assert reporter and str(found).startswith(
        "rank 1 on node1 (127.0.0.1) stopped with an error: ConfigError: amp=fp16 on device cpu: fp16 with "
        "GradScaler needs CUDA (its log has all of it)")


# ---- a slow store and late heartbeats: "could not tell", never a guess --------------------------






def test_a_silent_rank_whose_process_still_runs_here_is_not_accused_a_dead_one_is() -> None:
    """Rank 1 is a real process on this host that never beats (a heartbeat starved by a loaded host)."""
    import os
    import subprocess
    import sys

    from torchslurm.train.watchdog import _pid_namespace

    dog, _server, _ = _rank0_watchdog_on_a_real_store(2)
    rank1 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    here, ns = socket.gethostname(), _pid_namespace()
    dog.peers = [Peer(0, here, "127.0.0.1", os.getpid(), ns), Peer(1, here, "127.0.0.1", rank1.pid, ns)]
    try:
        alive, _ = dog.diagnose(RuntimeError(TIMEOUT))
        rank1.kill()
        rank1.wait()
        dead, _ = dog.diagnose(RuntimeError(TIMEOUT))
    finally:
        rank1.kill()
        dog.stop()
    assert str(alive).startswith(f"could not tell whether rank 1 on {here} (127.0.0.1) failed"), str(alive)
    assert str(dead).startswith(f"rank 1 on {here} (127.0.0.1) stopped responding (no heartbeat)"), str(dead)


def test_a_paused_store_neither_crashes_the_watchdogs_start_nor_gets_a_rank_accused(
        caplog: Any) -> None:
    """rank 0's store process is stopped (SIGSTOP), as on a host with far more ranks than CPUs: the
    kernel still accepts connections, nothing answers. start() warns instead of raising
    DistNetworkError, and the diagnosis says it could not tell."""
    import os
    import signal
    import subprocess
    import sys

    import torch
    import torch.distributed as dist
    from torch.distributed import HashStore

    from torchslurm.runtime.distenv import detect
    from torchslurm.runtime.distributed import DistContext
    from torchslurm.train.watchdog import WatchdogTimeouts

    server = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom torch.distributed import TCPStore\n"
                               "s = TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
                               "print(s.port, flush=True)\ntime.sleep(600)"], stdout=subprocess.PIPE, text=True)
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        port = int(server.stdout.readline()) if server.stdout else 0
        os.kill(server.pid, signal.SIGSTOP)
        env = detect({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": str(port)})
        quick = WatchdogTimeouts(connect_s=0.5, heartbeat_s=0.5, diagnosis_s=0.5)
        dog = Watchdog(DistContext(env, torch.device("cpu"), "gloo", {}), interval_s=0.05, timeouts=quick)
        dog.start()
        found, _ = dog.diagnose(RuntimeError(TIMEOUT))
        dog.stop()
    finally:
        dist.destroy_process_group()
        server.kill()
        server.wait()
    assert "the watchdog's heartbeat could not reach the store at 127.0.0.1" in caplog.text
    assert str(found).startswith("could not tell which rank failed: rank 0's store on "), str(found)

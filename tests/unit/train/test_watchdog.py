"""The watchdog: reading Gloo errors, finding silent ranks, the message; the heartbeat against a real store."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from torchslurm.train.watchdog import (
    Peer,
    Watchdog,
    describe_ranks,
    diagnosis,
    first_sentence,
    peer_address,
    silent_ranks,
)

PEERS = [Peer(0, "node1", "198.18.0.11"), Peer(1, "node1", "198.18.0.11"),
         Peer(2, "node2", "198.18.0.12"), Peer(3, "node2", "198.18.0.12")]
CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
          "[198.18.0.12]:41234. This is typically caused by a remote worker crashing. GLHF!")
TIMEOUT = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms for recv operation"


def test_gloo_errors_are_read() -> None:
    assert peer_address(CLOSED) == "198.18.0.12"
    assert peer_address("Connection closed by peer [::ffff:198.18.0.11]:29400") == "198.18.0.11"
    assert peer_address(TIMEOUT) is None
    assert first_sentence(CLOSED) == "Connection closed by peer [198.18.0.12]:41234"
    assert first_sentence(TIMEOUT) == "Timed out waiting 20000ms for recv operation"
    assert first_sentence("") == "no message"


def test_silent_ranks_are_those_whose_counter_did_not_move() -> None:
    assert silent_ranks({0: 5, 1: 5, 2: 4, 3: 4}, {0: 7, 1: 7, 2: 4, 3: 5}) == [2]
    assert silent_ranks({0: 1}, {0: 2}) == []


def test_ranks_are_grouped_by_host() -> None:
    assert describe_ranks([3], PEERS) == "rank 3 on node2 (198.18.0.12)"
    assert describe_ranks([0, 2, 3], PEERS) == "rank 0 on node1 (198.18.0.11); ranks 2, 3 on node2 (198.18.0.12)"


def test_message_names_the_dead_rank_first() -> None:
    error = diagnosis(PEERS[0], CLOSED, PEERS, [3], 20.0)
    text = str(error)
    assert error.exit_code == 1 and error.hint and error.hint.startswith("read the first failing rank's log")
    assert text.startswith("rank 3 on node2 (198.18.0.12) stopped responding (no heartbeat)")
    assert "(rank 0 on node1 saw: Connection closed by peer [198.18.0.12]:41234)" in text
    assert "within the process group timeout (20 s). HINT: " in text


def test_message_when_the_store_is_unreachable_or_gone() -> None:
    text = str(diagnosis(PEERS[2], TIMEOUT, PEERS, None, None, "timeout"))
    assert text.startswith("rank 0's host node1 (198.18.0.11) is unreachable from node2: that node or the network")
    assert "process group timeout. HINT" in text
    text = str(diagnosis(PEERS[2], CLOSED, PEERS, None, 20.0, "refused"))
    assert text.startswith("rank 0 on node1 (198.18.0.11) died: its host answers but its store refuses connections")


def test_message_when_every_rank_still_beats() -> None:
    text = str(diagnosis(PEERS[0], CLOSED, PEERS, [], 300.0))
    assert text.startswith("a collective failed with ranks 2, 3 on node2 (198.18.0.12) while every rank")


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


def test_a_rank_that_saw_the_failure_is_not_silent_even_if_its_heartbeat_stopped() -> None:
    assert silent_ranks({0: 5, 1: 5, 2: 4}, {0: 7, 1: 5, 2: 4}, saw_failure=[0, 1]) == [2]


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


def test_a_rank_that_stopped_on_its_own_error_is_named_with_that_error() -> None:
    errors = {2: "CheckpointError: resume='bogus' is neither auto, never nor a checkpoint folder"}
    text = str(diagnosis(PEERS[0], CLOSED, PEERS, [2, 3], 20.0, errors=errors))
    assert text.startswith("rank 2 on node2 (198.18.0.12) stopped with an error: CheckpointError: resume='bogus' "
                           "is neither auto, never nor a checkpoint folder (its log has all of it); rank 3 on node2 "
                           "(198.18.0.12) stopped responding (no heartbeat)")


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

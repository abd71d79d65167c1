"""The diagnosis of a failed collective: reading Gloo errors, finding silent ranks, the message."""

from __future__ import annotations

from torchslurm.train.diagnosis import (
    Peer,
    describe_ranks,
    diagnosis,
    first_sentence,
    peer_address,
    silent_ranks,
    store_peer,
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


def test_a_rank_that_saw_the_failure_is_not_silent_even_if_its_heartbeat_stopped() -> None:
    assert silent_ranks({0: 5, 1: 5, 2: 4}, {0: 7, 1: 5, 2: 4}, saw_failure=[0, 1]) == [2]


def test_a_rank_that_stopped_on_its_own_error_is_named_with_that_error() -> None:
    errors = {2: "CheckpointError: resume='bogus' is neither auto, never nor a checkpoint folder"}
    text = str(diagnosis(PEERS[0], CLOSED, PEERS, [2, 3], 20.0, errors=errors))
    assert text.startswith("rank 2 on node2 (198.18.0.12) stopped with an error: CheckpointError: resume='bogus' "
                           "is neither auto, never nor a checkpoint folder (its log has all of it); rank 3 on node2 "
                           "(198.18.0.12) stopped responding (no heartbeat)")


def test_a_store_that_answers_too_slowly_is_could_not_tell_not_an_unreachable_host() -> None:
    text = str(diagnosis(PEERS[2], TIMEOUT, PEERS, None, 300.0, "slow"))
    assert text.startswith("could not tell which rank failed: rank 0's store on node1 (198.18.0.11) accepts "
                           "connections but answers too slowly to read the heartbeats")
    assert "unreachable" not in text and "stopped responding" not in text


def test_a_rank_that_may_be_alive_is_not_named_as_the_cause() -> None:
    text = str(diagnosis(PEERS[0], TIMEOUT, PEERS, [], 300.0, unsure=[3]))
    assert text.startswith("could not tell whether rank 3 on node2 (198.18.0.12) failed: no recent heartbeat")
    assert "stopped responding" not in text
    both = str(diagnosis(PEERS[0], TIMEOUT, PEERS, [2], 300.0, unsure=[3]))
    assert both.startswith("rank 2 on node2 (198.18.0.12) stopped responding (no heartbeat)")
    assert "; could not tell whether rank 3 on node2" in both


def test_a_store_hosted_by_another_rank_than_0_is_named_with_its_host() -> None:
    """Under srun with SLURM_HOSTFILE, node1's first task (rank 2 here) hosts the store, not rank 0 on node2."""
    peers = [Peer(0, "node2", "198.18.0.12"), Peer(1, "node2", "198.18.0.12"),
             Peer(2, "node1", "198.18.0.11", hosts_store=True), Peer(3, "node1", "198.18.0.11")]
    assert store_peer(peers) is peers[2] and store_peer(peers[:2]) is peers[0]
    gone = diagnosis(peers[0], "Connection reset by peer", peers, None, 60, store="refused")
    assert "rank 2 on node1 (198.18.0.11) died: its host answers but its store refuses connections" in gone.message
    cut = diagnosis(peers[0], "timed out", peers, None, 60, store="timeout")
    assert "rank 2's host node1 (198.18.0.11) is unreachable from node2" in cut.message


HINT = ("read the first failing rank's log (srun prints 'task N: ...' for it); for a node or network problem check "
        "`scontrol show node`; the job resumes from its last checkpoint when requeued.")


def test_every_message_whole_with_its_hint() -> None:
    """Each kind of diagnosis as a user reads it, from the cause to the bound, and the one hint."""
    seen = "(rank 0 on node1 saw: Timed out waiting 20000ms for recv operation)"
    tail = "Every rank stops within the process group timeout (20 s)."
    dead = diagnosis(PEERS[0], TIMEOUT, PEERS, [3], 20.0)
    assert (dead.message, dead.hint, dead.exit_code) == (
        "rank 3 on node2 (198.18.0.12) stopped responding (no heartbeat): the process died (killed, crashed, out of "
        f"memory) or its node or network went away {seen}. {tail}", HINT, 1)
    errored = diagnosis(PEERS[0], TIMEOUT, PEERS, [2, 3], 20.0, errors={2: "E: two", 3: "E: three"})
    assert errored.message == (  # every silent rank said why: none "stopped responding"
        "rank 2 on node2 (198.18.0.12) stopped with an error: E: two (its log has all of it); rank 3 on node2 "
        f"(198.18.0.12) stopped with an error: E: three (its log has all of it) {seen}. {tail}")
    unsure = diagnosis(PEERS[0], TIMEOUT, PEERS, [], 20.0, unsure=[2, 3])
    assert unsure.message == (
        "could not tell whether ranks 2, 3 on node2 (198.18.0.12) failed: no recent heartbeat, but heartbeats come "
        "late when the store's host is overloaded (more ranks than CPUs?), so it may be alive "
        f"{seen}. {tail}")
    slow = diagnosis(PEERS[2], TIMEOUT, PEERS, None, None, "slow")
    assert slow.message == (
        "could not tell which rank failed: rank 0's store on node1 (198.18.0.11) accepts connections but answers too "
        "slowly to read the heartbeats (an overloaded host: more ranks than CPUs?) (rank 2 on node2 saw: Timed out "
        "waiting 20000ms for recv operation). Every rank stops within the process group timeout.")
    cut = diagnosis(PEERS[2], TIMEOUT, PEERS, None, 20.0)
    assert cut.message == (
        "rank 0's host node1 (198.18.0.11) is unreachable from node2: that node or the network between the nodes is "
        f"down (rank 2 on node2 saw: Timed out waiting 20000ms for recv operation). {tail}")


def test_a_collective_that_names_no_rank_is_said_without_one() -> None:
    anonymous = diagnosis(PEERS[0], TIMEOUT, PEERS, [], 20.0)
    assert anonymous.message == (
        "a collective failed while every rank still has a heartbeat (rank 0 on node1 saw: Timed out waiting 20000ms "
        "for recv operation). Every rank stops within the process group timeout (20 s).")


def test_the_first_sentence_loses_only_its_final_full_stop() -> None:
    assert first_sentence("Connection reset by peer.") == "Connection reset by peer"
    assert first_sentence(".hidden file gone on nodeX.") == ".hidden file gone on nodeX"
    assert first_sentence("Socket closed. Retry later.\nmore") == "Socket closed"

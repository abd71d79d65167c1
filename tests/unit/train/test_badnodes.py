"""badnodes.py: which errors point at the node (texts shaped as CUDA and NCCL print them), and which
nodes a requeued job may exclude and still be scheduled."""

from __future__ import annotations

import pytest
from tests.unit.jobs.conftest import fixture

from torchslurm.jobs.slurmoutput import parse_scontrol
from torchslurm.train.badnodes import (
    JobNodes,
    NodeFault,
    fault_of,
    job_nodes,
    node_level_reason,
    own_error,
    plan_exclusion,
    silent_nodes,
    unreachable_fault,
)
from torchslurm.train.diagnosis import Peer

TAIL = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with "
        "`TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
NCCL_SYSTEM = ("NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled system error (run with "
               "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclSystemError: System call (e.g. socket, malloc) "
               "or external library call failed or device error. \nLast error:\nsocketStartConnect: Connect to "
               "10.1.2.3<43211> failed : Software caused connection abort")
NCCL_REMOTE = ("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or "
               "there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a "
               "network error or a remote process exiting prematurely.")


@pytest.mark.parametrize(("text", "reason"), [
    ("CUDA error: uncorrectable ECC error encountered" + TAIL, "an uncorrectable ECC error"),
    ("CUDA error: unspecified launch failure" + TAIL, "a CUDA unspecified launch failure"),
    ("CUDA error: CUDA-capable device(s) is/are busy or unavailable" + TAIL,
     "a CUDA device that is busy or unavailable"),
    ("CUDA error: system not yet initialized" + TAIL, "a GPU system that is not initialized (fabric manager)"),
    ("Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.", "a lost GPU"),
    (NCCL_SYSTEM, "an NCCL system error"),
    # the program's own bugs: they fail the same on any node
    ("CUDA error: an illegal memory access was encountered" + TAIL, None),
    ("CUDA error: device-side assert triggered" + TAIL, None),
    ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB", None),
    ("CUDA error: misaligned address" + TAIL, None),
    # a peer died: that says nothing about this node
    (NCCL_REMOTE, None),
    ("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [198.18.0.12]:44253", None),
])
def test_node_level_errors_are_told_from_the_program_s_own(text: str, reason: str | None) -> None:
    assert node_level_reason(text) == reason


def test_a_cuda_error_is_the_rank_s_own_not_a_failed_collective() -> None:
    assert own_error("CUDA error: uncorrectable ECC error encountered" + TAIL)
    assert own_error("CUDA error: an illegal memory access was encountered" + TAIL)
    assert own_error("CUDA out of memory. Tried to allocate 20.00 MiB")
    assert not own_error(NCCL_SYSTEM)
    assert not own_error("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer")


def test_the_fault_names_the_rank_and_its_error() -> None:
    assert fault_of("node3", 5, "CUDA error: uncorrectable ECC error encountered") == \
        NodeFault("node3", 5, "rank 5 failed with an uncorrectable ECC error")
    assert fault_of("node3", 5, "CUDA error: an illegal memory access was encountered") is None
    assert fault_of("", 5, "CUDA error: uncorrectable ECC error encountered") is None  # no node to name


def test_the_job_s_nodes_from_a_recorded_scontrol_show_job() -> None:
    # sbatch -N2 --exclude=node3,node4 on the sandbox
    excluded = job_nodes(parse_scontrol(fixture("scontrol_excluded.txt")))
    assert excluded == JobNodes(("debug",), 2, ("node3", "node4"), ())
    running = job_nodes(parse_scontrol(fixture("scontrol_running.txt")))
    assert (running.excluded, running.required) == ((), ())
    assert job_nodes({"Partition": "a,b", "NumNodes": "2-4", "ReqNodeList": "n[1-2]"}) == \
        JobNodes(("a", "b"), 2, (), ("n1", "n2"))


FOUR = ["node1", "node2", "node3", "node4"]
ECC3 = NodeFault("node3", 5, "rank 5 failed with an uncorrectable ECC error")


def test_a_bad_node_is_merged_into_the_job_s_excludes() -> None:
    plan = plan_exclusion([ECC3], JobNodes(("debug",), 2, ("node4",), ()), FOUR)
    assert (plan.exclude, plan.added) == (("node4", "node3"), ("node3",))
    assert plan.message == "excluded node3 from the next attempt: rank 5 failed with an uncorrectable ECC error"


def test_never_so_many_that_the_job_cannot_be_scheduled() -> None:
    plan = plan_exclusion([ECC3], JobNodes(("debug",), 3, ("node4",), ()), FOUR)
    assert plan.exclude == ()
    assert plan.message == ("kept node3 although rank 5 failed with an uncorrectable ECC error: only 2 node(s) of "
                            "partition debug would be left for a 3-node job")
    # the first fault fits, the second would leave too few
    two = plan_exclusion([ECC3, NodeFault("node1", 0, "rank 0 failed with an NCCL system error")],
                         JobNodes(("debug",), 2, ("node4",), ()), FOUR)
    assert two.added == ("node3",) and "kept node1 although rank 0 failed with an NCCL system error: only 1 " in \
        two.message


@pytest.mark.parametrize(("job", "nodes", "limit", "why"), [
    (JobNodes(("debug",), 1, ("node1", "node2"), ()), FOUR, 2,
     "the job's ExcNodeList would exceed max_excluded_nodes=2"),
    (JobNodes(("debug",), 1, (), ()), FOUR, 0, "max_excluded_nodes=0 turns exclusion off"),
    (JobNodes(("debug",), 1, (), ("node3",)), FOUR, 4, "node3 is in its --nodelist"),
    (JobNodes(("debug",), 1, (), ()), None, 4, "sinfo could not list its partition"),
])
def test_bounds_keep_the_node(job: JobNodes, nodes: list[str] | None, limit: int, why: str) -> None:
    plan = plan_exclusion([ECC3], job, nodes, limit)
    assert (plan.exclude, plan.message) == ((), f"kept node3 although {ECC3.reason}: {why}")


def test_a_node_already_excluded_is_not_written_again() -> None:
    plan = plan_exclusion([ECC3, ECC3], JobNodes(("debug",), 1, ("node3",), ()), FOUR)
    assert (plan.exclude, plan.message) == ((), "node3 already excluded from the next attempt")


def test_only_nodes_whose_every_rank_went_silent_without_an_error_are_probed() -> None:
    peers = [Peer(0, "h1", "198.18.0.11", node="node1"), Peer(1, "h1", "198.18.0.11", node="node1"),
             Peer(2, "h2", "198.18.0.12", node="node2"), Peer(3, "h2", "198.18.0.12", node="node2"),
             Peer(4, "h3", "198.18.0.13", node="node3")]
    assert silent_nodes(peers, [1, 2, 3, 4], {4: "ValueError: bad"}) == [peers[2]]
    assert unreachable_fault(peers[2], "h1") == NodeFault(
        "node2", 2, "rank 2 stopped responding and node2 (198.18.0.12) does not answer from h1")
    assert unreachable_fault(Peer(7, "h9", "198.18.0.19"), "h1").node == "h9"  # no Slurm node name: the host


def test_a_job_whose_show_job_says_little_needs_one_node_anywhere() -> None:
    assert job_nodes({}) == JobNodes((), 1, (), ())
    assert job_nodes({"NumNodes": "N/A", "Partition": "gpu,debug", "ReqNodeList": "node[1-2]"}) == JobNodes(
        ("gpu", "debug"), 1, (), ("node1", "node2"))
    assert job_nodes({"NumNodes": "3-6"}).nodes_needed == 3


def test_the_excludes_may_reach_the_limit_but_not_pass_it() -> None:
    plan = plan_exclusion([ECC3], JobNodes(("debug",), 1, ("node1", "node2", "node4"), ()), [*FOUR, "node5"], 4)
    assert plan.exclude == ("node1", "node2", "node4", "node3")


def test_a_fault_already_excluded_does_not_stop_the_next_from_being_excluded() -> None:
    node1 = NodeFault("node1", 0, "rank 0 failed with an NCCL system error")
    plan = plan_exclusion([ECC3, node1], JobNodes(("debug",), 1, ("node3",), ()), FOUR)
    assert (plan.exclude, plan.added) == (("node3", "node1"), ("node1",))
    assert plan.message == "excluded node1 from the next attempt: rank 0 failed with an NCCL system error"
    both = plan_exclusion([ECC3, node1], JobNodes(("debug",), 1, (), ()), FOUR)
    assert both.message == ("excluded node3 from the next attempt: rank 5 failed with an uncorrectable ECC error; "
                            "excluded node1 from the next attempt: rank 0 failed with an NCCL system error")
    again = plan_exclusion([ECC3, node1], JobNodes(("debug",), 1, ("node1", "node3"), ()), FOUR)
    assert again.message == "node3, node1 already excluded from the next attempt"


@pytest.mark.parametrize(("partitions", "named"), [(("gpu", "debug"), "gpu,debug"), ((), "?")])
def test_too_few_nodes_left_names_the_job_s_partitions(partitions: tuple[str, ...], named: str) -> None:
    plan = plan_exclusion([ECC3], JobNodes(partitions, 4, (), ()), FOUR)
    assert plan.message == (f"kept node3 although {ECC3.reason}: only 3 node(s) of partition {named} would be left "
                            "for a 4-node job")


def test_outside_slurm_the_silent_hosts_are_probed() -> None:
    peers = [Peer(0, "h1", "198.18.0.11"), Peer(1, "h1", "198.18.0.11"), Peer(2, "h2", "198.18.0.12")]
    assert silent_nodes(peers, [2], {}) == [peers[2]]

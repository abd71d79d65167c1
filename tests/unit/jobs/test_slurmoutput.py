"""What Slurm's commands print, read (jobs.slurmoutput), on outputs recorded from the sandbox's Slurm
22.05.8 (tests/fixtures/slurm_output/, rewritten by TORCHSLURM_RECORD_FIXTURES=1 on the cluster tests)."""

from __future__ import annotations

import pytest
from tests.unit.jobs.conftest import fixture

from torchslurm.errors import SlurmError
from torchslurm.jobs.slurmoutput import (
    explain_reason,
    gpus_of_gres,
    parse_job_id,
    parse_scontrol,
    parse_sinfo_nodes,
    parse_squeue,
    status_from_scontrol,
)


def test_parse_job_id() -> None:
    assert parse_job_id(fixture("sbatch_parsable.txt")) == "3"
    assert parse_job_id("42;cluster2\n") == "42"
    with pytest.raises(SlurmError, match=r"sbatch --parsable printed 'Submitted batch job 4', expected a job id"):
        parse_job_id("Submitted batch job 4")


def test_parse_squeue_running_and_pending() -> None:
    (running,) = parse_squeue(fixture("squeue_running.txt"))
    assert (running.job_id, running.state, running.nodes, running.reason, running.name) == (
        "1", "RUNNING", "2", "node[1-2]", "probe")
    (pending,) = parse_squeue(fixture("squeue_pending.txt"))
    assert (pending.state, pending.reason, pending.time_limit, pending.finished) == (
        "PENDING", "JobHeldUser", "UNLIMITED", False)
    assert [(r.job_id, r.name) for r in parse_squeue(fixture("squeue_user.txt"))] == [("2", "to-cancel")]
    two = parse_squeue(fixture("squeue_running.txt") + fixture("squeue_pending.txt"))
    assert [r.state for r in two] == ["RUNNING", "PENDING"]


def test_parse_squeue_rejects_other_formats() -> None:
    with pytest.raises(SlurmError, match=r"expected 7 tab-separated fields.*HINT: an SQUEUE_FORMAT variable"):
        parse_squeue("JOBID PARTITION NAME\n")


def test_scontrol_one_line_and_multi_line_forms_agree() -> None:
    one = parse_scontrol(fixture("scontrol_running.txt"))
    multi = parse_scontrol(fixture("scontrol_completed.txt"))
    assert set(one) == set(multi)
    st = status_from_scontrol(multi)
    assert (st.job_id, st.name, st.state, st.exit_code, st.nodes, st.succeeded) == (
        "1", "probe", "COMPLETED", "0:0", "node[1-2]", True)
    assert st.stdout.endswith("/probe-1.out") and one["AllocNode:Sid"] == "localhost:2876"
    assert one["NtasksPerN:B:S:C"] == "2:0:*:*" and one["Power"] == ""


def test_cancelled_status() -> None:
    st = status_from_scontrol(parse_scontrol(fixture("scontrol_cancelled.txt")))
    assert (st.state, st.exit_code, st.finished, st.succeeded) == ("CANCELLED", "0:15", True, False)


def test_values_with_spaces() -> None:
    fields = parse_scontrol("JobId=9 JobName=a b c UserId=root(0) Reason=None StdOut=/x y/o.out Power=")
    assert (fields["JobName"], fields["StdOut"], fields["Power"]) == ("a b c", "/x y/o.out", "")


def test_sinfo_nodes_and_their_gpus() -> None:
    nodes = parse_sinfo_nodes(fixture("sinfo_nodes.txt"))  # recorded on the sandbox: 4 nodes x 4 CPUs, gpu:4
    assert [(n.name, n.partition, n.default, n.cpus, n.gpus, n.memory_mb) for n in nodes][:2] == [
        ("node1", "debug", True, 4, 4, 2000), ("node2", "debug", True, 4, 4, 2000)]
    assert [gpus_of_gres(g) for g in ("gpu:4", "gpu:a100:8(S:0-1)", "gpu:a100:4,gpu:v100:2", "(null)",
                                      "mps:100,gpu:2")] == [4, 8, 6, 0, 2]
    with pytest.raises(SlurmError, match="expected 5 tab-separated fields"):
        parse_sinfo_nodes("node1 debug 4\n")


def test_a_pending_reason_is_said_in_words() -> None:
    held = status_from_scontrol(parse_scontrol(fixture("scontrol_held.txt")))  # sbatch --hold on the sandbox
    assert (held.state, held.reason) == ("PENDING", "JobHeldUser")
    assert explain_reason(held.reason) == "JobHeldUser (held by its owner: `scontrol release JOB` lets it start)"
    assert explain_reason("PartitionConfig").startswith("PartitionConfig (it asks for more than the partition")
    assert explain_reason("SomethingNew") == "SomethingNew"

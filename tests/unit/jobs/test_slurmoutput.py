"""What Slurm's commands print, read (jobs.slurmoutput), on outputs recorded from the sandbox's Slurm
22.05.8 (tests/fixtures/slurm_output/, rewritten by TORCHSLURM_RECORD_FIXTURES=1 on the cluster tests)."""

from __future__ import annotations

import pytest
from tests.unit.jobs.conftest import fixture

from torchslurm.errors import SlurmError
from torchslurm.jobs.slurmoutput import (
    JobStatus,
    NodeInfo,
    check_job_id,
    controller_unreachable,
    explain_reason,
    failure_hint,
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


def test_a_site_wrapper_s_banner_before_the_job_id_is_skipped_and_nothing_is_refused_whole() -> None:
    assert parse_job_id("Welcome to the cluster\nAccount: ml\n4711\n") == "4711"
    assert parse_job_id("4711;cluster2\n\n") == "4711"
    with pytest.raises(SlurmError) as info:
        parse_job_id("")
    assert (info.value.message, info.value.hint) == (
        "sbatch --parsable printed '', expected a job id.",
        "check for a site wrapper around sbatch that prints extra text.")
    with pytest.raises(SlurmError, match=r"printed 'Submitted batch job 4\\n5 more', expected a job id"):
        parse_job_id("Submitted batch job 4\n5 more")


def test_a_job_id_that_is_not_one_is_refused_whole() -> None:
    assert [check_job_id(j) for j in ("12345", " 12345_7\n", "12345_[1-3,5%2]", "12345+1")] == [
        "12345", "12345_7", "12345_[1-3,5%2]", "12345+1"]
    with pytest.raises(SlurmError) as info:
        check_job_id("12x")
    assert (info.value.message, info.value.hint) == (
        "job id '12x' is not a Slurm job id: expected digits, e.g. 12345, or 12345_7 for an array task.",
        "`torchslurm status` lists your jobs and their ids.")


def test_squeue_keeps_tabs_and_spaces_inside_a_job_name_and_reads_every_row() -> None:
    rows = ("7\tRUNNING\t1:02:03\t2:00:00\t1\tnode3\tmy  job\twith a tab\n\n"
            "8\tPENDING\t0:00\t5:00\t4\t(ReqNodeNotAvail, UnavailableNodes:nodeX)\tb\n")
    first, second = parse_squeue(rows)  # a blank line between rows does not end the list
    assert (first.job_id, first.state, first.elapsed, first.time_limit, first.nodes, first.reason, first.name) == (
        "7", "RUNNING", "1:02:03", "2:00:00", "1", "node3", "my  job\twith a tab")
    assert (second.reason, second.nodes, second.elapsed, second.name) == (  # squeue's (...) taken off
        "ReqNodeNotAvail, UnavailableNodes:nodeX", "4", "0:00", "b")
    with pytest.raises(SlurmError) as info:
        parse_squeue("1\tRUNNING\t0:01\n")
    assert info.value.message == ("squeue printed '1\\tRUNNING\\t0:01', expected 7 tab-separated fields "
                                  "('%i\\t%T\\t%M\\t%l\\t%D\\t%R\\t%j').")
    assert info.value.hint == "an SQUEUE_FORMAT variable may override -o; unset it."


def test_scontrol_keeps_a_value_s_own_spacing() -> None:
    fields = parse_scontrol("JobId=9 JobName=two  spaces\tand a tab\n   UserId=root(0)")
    assert fields["JobName"] == "two  spaces\tand a tab" and fields["UserId"] == "root(0)"


def test_every_field_of_a_job_s_status_comes_from_its_scontrol_key() -> None:
    completed = status_from_scontrol(parse_scontrol(fixture("scontrol_completed.txt")))
    assert (completed.elapsed, completed.time_limit, completed.restarts, completed.tasks, completed.excluded,
            completed.reason) == ("00:00:04", "00:05:00", 0, 4, "", "None")
    assert completed.stderr.endswith("/probe-1.out") and completed.stdout == completed.stderr
    excluded = status_from_scontrol(parse_scontrol(fixture("scontrol_excluded.txt")))
    assert (excluded.excluded, excluded.tasks, excluded.reason) == ("node[3-4]", 2, "JobHeldUser")
    requeued = status_from_scontrol(parse_scontrol("JobId=5 JobState=PENDING Restarts=3 NumTasks=(null) "
                                                   "StdErr=/logs/e.err"))
    assert (requeued.restarts, requeued.tasks, requeued.stderr) == (3, 0, "/logs/e.err")
    odd = status_from_scontrol(parse_scontrol("JobId=5 JobState=PENDING Restarts=N/A NumTasks=2"))
    assert (odd.restarts, odd.tasks) == (0, 2)


def test_a_status_missing_a_key_takes_slurm_s_defaults() -> None:
    bare = status_from_scontrol({"JobId": "5", "JobState": "RUNNING"})
    assert bare == JobStatus(job_id="5", state="RUNNING", reason="None")
    assert (bare.name, bare.nodes, bare.exit_code, bare.elapsed, bare.time_limit, bare.stdout, bare.stderr,
            bare.restarts, bare.tasks, bare.excluded) == ("", "", "", "", "", "", "", 0, 0, "")


def test_a_status_without_its_job_id_or_state_is_refused_with_the_keys_it_had() -> None:
    keys = {f"K{i}": "x" for i in range(10)}
    for fields in ({"JobId": "5", **keys}, {"JobState": "RUNNING"}):
        with pytest.raises(SlurmError) as info:
            status_from_scontrol(fields)
        assert info.value.hint == "run `scontrol show job <id>` yourself to see what it says."
    assert info.value.message == "scontrol show job printed no JobId/JobState (got keys ['JobState'])."
    with pytest.raises(SlurmError) as info:
        status_from_scontrol({"JobId": "5", **keys})
    assert info.value.message == ("scontrol show job printed no JobId/JobState (got keys "
                                  "['JobId', 'K0', 'K1', 'K2', 'K3', 'K4', 'K5', 'K6']).")


def test_sinfo_rows_read_past_blank_lines_and_unknown_numbers_are_zero() -> None:
    rows = "gpu1\tgpu*\t64\tgpu:a100:8(S:0-1)\t512000\n\nbig\tlongX\tN/A\t\t2000+\n"
    gpu, big = parse_sinfo_nodes(rows)
    assert gpu == NodeInfo(name="gpu1", partition="gpu", default=True, cpus=64, gpus=8, memory_mb=512000)
    assert big == NodeInfo(name="big", partition="longX", default=False, cpus=0, gpus=0, memory_mb=0)  # no GRES
    with pytest.raises(SlurmError) as info:
        parse_sinfo_nodes("node 1\tdebug 4\n")
    assert info.value.message == ("sinfo printed 'node 1\\tdebug 4', expected 5 tab-separated fields "
                                  "('%N\\t%P\\t%c\\t%G\\t%m').")
    assert info.value.hint == "an SINFO_FORMAT variable may override -o; unset it."


@pytest.mark.parametrize("message", [fixture("squeue_no_controller.stderr"), fixture("scontrol_no_config.stderr"),
                                     "sbatch not found on PATH.", "Socket timed out on send/recv operation",
                                     "error: Connection refused", "Zero Bytes were transmitted or received",
                                     "Could not establish a configuration source"])
def test_a_client_that_found_no_controller_is_told_apart(message: str) -> None:
    assert controller_unreachable(message)
    if "PATH" not in message:
        assert failure_hint(message) == (
            "Slurm's controller cannot be reached from here: check that SLURM_CONF (or /etc/slurm/slurm.conf) names "
            "your cluster and that slurmctld is up (`scontrol ping`); with no cluster, `torchslurm sandbox up` starts "
            "a local one.")


def test_a_job_s_own_failure_is_not_blamed_on_the_controller() -> None:
    message = fixture("squeue_invalid_job.stderr")
    assert not controller_unreachable(message)
    assert failure_hint(message) == "the message above is Slurm's; fix what it names and retry."

"""Spelling: one message names a field as a spec-file key or as the flag the user typed."""

from __future__ import annotations

from torchslurm.jobs.spelling import SPEC_FILE, command_line, flag


def test_spec_file_keys() -> None:
    assert SPEC_FILE.name("gpus_per_node") == "gpus_per_node"
    assert SPEC_FILE.given("nodes", 0) == "nodes=0"
    assert SPEC_FILE.given("requeue", False) == "requeue=false"
    assert SPEC_FILE.setting("tasks_per_node", 4) == "tasks_per_node: 4"
    assert SPEC_FILE.setting("preemptible", True) == "preemptible: true"


def test_flags_for_the_fields_given_as_flags_only() -> None:
    spelling = command_line({"gpus_per_node", "requeue", "per_rank_output"})
    assert spelling.name("gpus_per_node") == "--gpus-per-node"
    assert spelling.given("gpus_per_node", -2) == "--gpus-per-node=-2"
    assert spelling.given("requeue", False) == "--no-requeue"
    assert spelling.setting("requeue", True) == "--requeue"
    assert spelling.setting("per_rank_output", False) == "--no-per-rank-output"
    assert spelling.setting("gpus_per_node", 4) == "--gpus-per-node 4"
    assert spelling.setting("nodes", 2) == "nodes: 2"  # not given as a flag: a key of the spec file


def test_flag() -> None:
    assert (flag("grace_s"), flag("requeue", False)) == ("--grace-s", "--no-requeue")
    assert flag("requeue", True) == "--requeue"

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


def test_a_flags_value_is_quoted_where_a_shell_would_split_or_expand_it() -> None:
    sp = command_line(["python", "name", "time"])
    assert sp.setting("python", "apptainer exec --nv image.sif python") == (
        "--python 'apptainer exec --nv image.sif python'")
    assert sp.setting("name", "it's") == "--name 'it'\"'\"'s'"
    assert [sp.setting("name", v) for v in ("$HOME", "a;b", "x*", "~u", "#1", "")] == [
        "--name '$HOME'", "--name 'a;b'", "--name 'x*'", "--name '~u'", "--name '#1'", "--name ''"]
    assert [sp.setting("time", v) for v in ("1:30:00", "0-15%4", "/opt/venv/bin/python", "a=b,c")] == [
        "--time 1:30:00", "--time 0-15%4", "--time /opt/venv/bin/python", "--time a=b,c"]
    assert sp.setting("name", '"..."') == '--name "..."'  # a template to fill in stays as it is
    assert SPEC_FILE.setting("python", "apptainer exec image.sif python") == "python: apptainer exec image.sif python"

"""JobSpec construction and loading, and findings.validate(): pure logic, plain data in, data out."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.errors import ConfigError
from torchslurm.jobs.findings import validate
from torchslurm.jobs.spec import JobSpec, load, parse_slurm_version, parse_time


def codes(spec: JobSpec, version: str | None = None) -> dict[str, str]:
    return {f.code: f.severity for f in validate(spec, version)}


def test_defaults_srun_gpu_layout() -> None:
    spec = JobSpec(script="train.py", nodes=2, gpus_per_node=4)
    assert (spec.slurm_tasks_per_node, spec.ranks_per_node, spec.world_size) == (4, 4, 8)
    assert codes(spec) == {}


def test_defaults_torchrun_layout() -> None:
    spec = JobSpec(script="train.py", nodes=2, gpus_per_node=8, launch="torchrun", cpus_per_task=32)
    assert (spec.slurm_tasks_per_node, spec.ranks_per_node, spec.world_size) == (1, 8, 16)
    assert codes(spec) == {}


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 5400), ("0:30", 30), ("1:30:00", 5400), ("2-00", 172800), ("1-02:03", 93780),
    ("1-02:03:04", 93784), ("0-04:00:00", 14400),
])
def test_parse_time(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


def test_bad_time_says_formats() -> None:
    with pytest.raises(ConfigError, match=r"time='1h' is not a Slurm time limit\. HINT: use minutes"):
        JobSpec(script="t.py", time="1h")


def test_unknown_choice_lists_valid() -> None:
    with pytest.raises(ConfigError, match=r"launch='mpirun' is not one of srun, torchrun\. HINT"):
        JobSpec(script="t.py", launch="mpirun")


def test_signal_normalised() -> None:
    assert JobSpec(script="t.py", signal="sigusr1").signal == "USR1"
    with pytest.raises(ConfigError, match=r"signal='KILL' is not one of USR1, USR2"):
        JobSpec(script="t.py", signal="KILL")


def test_wrong_types_rejected() -> None:
    with pytest.raises(ConfigError, match=r"nodes='2' is not an integer"):
        JobSpec(script="t.py", nodes="2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"args='a b' is a str, expected a list of strings"):
        JobSpec(script="t.py", args="a b")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"nodes=0 must be at least 1\. HINT: set nodes to 1 or more\."):
        JobSpec(script="t.py", nodes=0)


def test_newline_in_name_rejected() -> None:
    with pytest.raises(ConfigError, match=r"name='a\\nb' contains '\\n'.*HINT: remove the line break"):
        JobSpec(script="t.py", name="a\nb")


def test_env_key_must_be_identifier() -> None:
    with pytest.raises(ConfigError, match=r"env key 'A B' is not a shell variable name"):
        JobSpec(script="t.py", env={"A B": "1"})
    assert JobSpec(script="t.py", env={"B": 1, "A": True}).env == {"A": "true", "B": "1"}  # type: ignore[dict-item]


def test_nproc_only_in_torchrun_mode() -> None:
    with pytest.raises(ConfigError, match=r"nproc_per_node=2 with launch='srun'.*HINT: use tasks_per_node"):
        JobSpec(script="t.py", nproc_per_node=2)


def test_load_yaml_flags_win(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("script: train.py\nnodes: 2\ngpus-per-node: 4\ntime: 90\nargs: [--epochs, '3']\n")
    spec = load(path, {"nodes": 4, "name": None})
    assert (spec.nodes, spec.gpus_per_node, spec.time, spec.args, spec.name) == (
        4, 4, "90", ("--epochs", "3"), "torchslurm")


def test_load_toml(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('script = "train.py"\nlaunch = "torchrun"\n[env]\nNCCL_DEBUG = "INFO"\n')
    spec = load(path)
    assert (spec.launch, dict(spec.env)) == ("torchrun", {"NCCL_DEBUG": "INFO"})


def test_unknown_key_lists_valid(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("script: train.py\ngpus: 4\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in .*job.yaml: gpus\. HINT: valid keys are "
                                          r"script, args, name, nodes, gpus_per_node"):
        load(path)
    path.write_text("script: train.py\ngpu_per_node: 4\ntasks_per_nodes: 4\n")
    with pytest.raises(ConfigError, match=r"HINT: did you mean gpu_per_node -> gpus_per_node, tasks_per_nodes -> "
                                          r"tasks_per_node\? valid keys are script"):
        load(path)


def test_missing_script(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no `script` in flags\. HINT: give the training script after the flags "
                                          r"\(`torchslurm submit --nodes 2 train.py`\) or as `script: train.py`"):
        load(None, {"nodes": 2})


def test_srun_tasks_vs_gpus_error() -> None:
    found = validate(JobSpec(script="t.py", nodes=4, gpus_per_node=4, tasks_per_node=1))
    assert found[0].code == "tasks-vs-gpus" and found[0].severity == "error"
    assert "set tasks_per_node: 4, or use launch: torchrun" in found[0].hint


def test_torchrun_nproc_vs_gpus_and_tasks() -> None:
    spec = JobSpec(script="t.py", gpus_per_node=4, launch="torchrun", nproc_per_node=2, tasks_per_node=4,
                   cpus_per_task=8)
    assert codes(spec) == {"torchrun-tasks": "error", "nproc-vs-gpus": "error"}


def test_torchrun_cpus_warning() -> None:
    assert codes(JobSpec(script="t.py", launch="torchrun", nproc_per_node=2)) == {"torchrun-cpus": "warning"}


def test_cpu_job_with_nccl() -> None:
    assert codes(JobSpec(script="t.py", backend="nccl")) == {"nccl-without-gpu": "error"}


def test_preemption_grace_longer_than_time() -> None:
    spec = JobSpec(script="t.py", preemptible=True, time="2", grace_s=300)
    found = validate(spec)
    assert found[0].code == "grace-vs-time"
    assert "grace_s=300 is not shorter than time='2' (120 s)" in found[0].message


def test_preemption_without_time_and_requeue() -> None:
    spec = JobSpec(script="t.py", preemptible=True, requeue=False, grace_s=30)
    assert codes(spec) == {
        "signal-without-time": "warning", "no-requeue": "warning", "short-grace": "warning"}


def test_gpu_flag_by_version() -> None:
    spec = JobSpec(script="t.py", gpus_per_node=2)
    assert codes(spec, "slurm 18.08.9") == {"gpu-flag": "error"}
    assert codes(spec, "slurm-wlm 22.05.8") == {}
    assert codes(JobSpec(script="t.py", gpus_per_node=2, gpu_flag="gres"), "22.05") == {"gpu-flag": "info"}
    assert parse_slurm_version("slurm-wlm 22.05.8") == (22, 5)


def test_effective_batch_summary_like_seed_004() -> None:
    spec = JobSpec(script="t.py", nodes=6, gpus_per_node=1, batch_size=64, lr=0.01)
    (found,) = validate(spec)
    assert "effective batch size = 64 per rank x 6 ranks = 384" in found.message
    assert found.message.endswith("; lr=0.01 was tuned for which batch size?")  # one mark, not "?."
    assert "lr=0.06" in found.hint
    (plain,) = validate(JobSpec(script="t.py", nodes=6, gpus_per_node=1, batch_size=64))
    assert plain.message.endswith("(6 node(s) x 1 rank(s)).")


def test_nic_override_warns() -> None:
    assert codes(JobSpec(script="t.py", nic="eth0")) == {"nic-override": "warning"}


def test_errors_sorted_first() -> None:
    spec = JobSpec(script="t.py", nic="eth0", backend="nccl")
    assert [f.severity for f in validate(spec)] == ["error", "warning"]


def test_slash_in_name_rejected() -> None:
    with pytest.raises(ConfigError, match=r"name='a/b' contains '/'.*HINT: use a name without '/', e.g. 'a-b'"):
        JobSpec(script="t.py", name="a/b")


def test_text_that_cannot_be_utf8_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"nic='\\ud800' holds '\\ud800', which cannot be written as UTF-8.*HINT"):
        JobSpec(script="train.py", nic="\ud800")


def test_every_invalid_field_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as raised:
        JobSpec(script="t.py", nodes=0, time="abc", launch="mpirun", mem="lots", name="a/b")
    assert str(raised.value).startswith("5 invalid settings:\n  launch='mpirun' is not one of srun, torchrun.")
    assert [p.message.split("=")[0].split(" ")[0] for p in raised.value.problems] == ["launch", "time", "mem", "nodes",
                                                                                    "name"]
    assert all("HINT:" in str(p) for p in raised.value.problems)
    # a wrong type is reported before the checks that compare values (they would fail on it)
    with pytest.raises(ConfigError, match=r"^2 invalid settings:\n  nodes='2' is not an integer.*\n  preemptible="):
        JobSpec(script="t.py", nodes="2", preemptible="yes", time="abc")  # type: ignore[arg-type]


def test_a_string_where_a_list_belongs_names_the_item() -> None:
    with pytest.raises(ConfigError, match=r"^setup='source x' is a str, expected a list of strings\. HINT: write "
                                          r'setup: \["source x"\] \(a list, one item per shell line\)\.$'):
        JobSpec(script="t.py", setup="source x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r'HINT: write args: \["--lr", "1"\] \(a list, one item per argument\)\.$'):
        JobSpec(script="t.py", args="--lr 1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r'HINT: write setup: \["\.\.\.", "\.\.\."\] \(a list, one item per shell'):
        JobSpec(script="t.py", setup=3)  # type: ignore[arg-type]

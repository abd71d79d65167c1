"""jobs.flags: sbatch's spellings the job spec says another way, sbatch-only options, torchrun's flags,
and Slurm flags given after the script (the CLI's messages from them: tests/unit/cli/test_jobs_ux.py)."""

from __future__ import annotations

from torchslurm.jobs.flags import (
    SBATCH_ONLY,
    SLURM_EQUIVALENTS,
    TORCHRUN_FLAGS,
    flag_name,
    misplaced_flags,
    slurm_flag_advice,
    torchrun_flag_advice,
)

SPEC_FLAGS = {"--gpus-per-node", "--tasks-per-node", "--name", "--nodes", "--partition", "--time"}


def test_a_flag_is_named_without_its_value() -> None:
    assert [flag_name(a) for a in ("--gpus=8", "--gpus", "-n4", "-G", "--export=A=1,B=2")] == [
        "--gpus", "--gpus", "-n", "-G", "--export"]


def test_an_sbatch_spelling_is_advised_only_where_its_torchslurm_flag_is_accepted() -> None:
    what, hint = slurm_flag_advice("--gpus=8", SPEC_FLAGS) or ("", "")
    assert what == "--gpus is Slurm's GPU count for the whole job; torchslurm asks per node"
    assert hint.startswith("use --gpus-per-node N")
    assert slurm_flag_advice("-J", SPEC_FLAGS) == (
        "-J is spelled --name in torchslurm (rendered as #SBATCH --job-name)", "use --name NAME")
    assert slurm_flag_advice("-t10", SPEC_FLAGS) == ("-t is sbatch's short form of --time", "use --time")
    assert slurm_flag_advice("--gpus=8", {"--nproc"}) is None  # e.g. `torchslurm run`: no --gpus-per-node
    assert slurm_flag_advice("--lr=0.1", SPEC_FLAGS) is None


def test_an_sbatch_only_option_points_at_sbatch_itself() -> None:
    what, hint = slurm_flag_advice("--reservation=r1", SPEC_FLAGS) or ("", "")
    assert what.startswith("--reservation is an sbatch option that the job spec has no field for")
    assert "`sbatch --reservation=... job.sbatch`" in hint
    assert slurm_flag_advice("--reservation=r1", {"--gpus-per-node"}) is None  # not a job command
    assert not SBATCH_ONLY & set(SLURM_EQUIVALENTS)


def test_torchrun_flags_are_advised_only_to_commands_that_start_ranks() -> None:
    assert torchrun_flag_advice("--nproc_per_node=4", {"--nproc"}) == (
        "--nproc_per_node is torchrun's spelling of --nproc",
        "use --nproc N (ranks on this machine; per node inside an allocation)")
    assert torchrun_flag_advice("--nproc_per_node=4", SPEC_FLAGS | {"--nproc-per-node"}) is None  # submit, script
    assert torchrun_flag_advice("--lr=0.1", {"--nproc"}) is None
    assert {f for f in TORCHRUN_FLAGS if "_" in f} == {
        "--nproc_per_node", "--master_addr", "--master_port", "--rdzv_endpoint", "--rdzv_backend", "--rdzv_id",
        "--node_rank"}
    assert all(f.replace("_", "-") in TORCHRUN_FLAGS for f in TORCHRUN_FLAGS)  # both spellings, as torchrun takes


def test_slurm_flags_after_the_script_are_errors_once_each() -> None:
    found = misplaced_flags("t.py", ["--nodes", "4", "--lr", "0.1", "--time=10", "--nodes=2"])
    assert [(f.severity, f.code, f.message.split(" comes")[0]) for f in found] == [
        ("error", "misplaced-flag", "--nodes"), ("error", "misplaced-flag", "--time")]
    assert found[0].message == "--nodes comes after t.py, so t.py gets it and the job spec does not."
    assert found[0].hint == ("put torchslurm's flags before the script (--nodes ... t.py ...); if t.py itself "
                             "takes --nodes, give --force before t.py")
    assert misplaced_flags("t.py", ["--lr", "0.1"]) == []
    assert [f.message.split(" ")[0] for f in misplaced_flags("t.py", ["--constraint=a=b"])] == ["--constraint"]

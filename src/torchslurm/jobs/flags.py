"""Flags on a command line that the job spec reads differently: sbatch's own spellings of what the
spec asks another way (`--gpus 8` for the whole job, `-J NAME`), sbatch options the spec has no field
for, torchrun's flags that `torchslurm run` does without (`--nproc_per_node`, `--nnodes`, `--standalone`),
and torchslurm's Slurm flags given after the script (the script would get them). Pure: the CLI says what a
subcommand accepts and prints the advice.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from torchslurm.jobs.findings import Finding
from torchslurm.jobs.spelling import flag

# sbatch's own spelling (sbatch(1)) of what the job spec asks in another way: flag -> (torchslurm
# flag, what the sbatch flag means, how to say it in torchslurm).
_PER_NODE_GPUS = ("--gpus-per-node", "is Slurm's GPU count for the whole job; torchslurm asks per node",
                  "use --gpus-per-node N (the job gets --nodes x N GPUs), e.g. --nodes 2 --gpus-per-node 4 "
                  "for 8 GPUs")
_PER_NODE_TASKS = ("--tasks-per-node", "is Slurm's task count for the whole job; torchslurm asks per node",
                   "use --tasks-per-node N (the job gets --nodes x N tasks); in srun mode it defaults to "
                   "--gpus-per-node, one task per GPU")
_NAME = ("--name", "is spelled --name in torchslurm (rendered as #SBATCH --job-name)", "use --name NAME")
SLURM_EQUIVALENTS: dict[str, tuple[str, str, str]] = {
    "--gpus": _PER_NODE_GPUS, "-G": _PER_NODE_GPUS,
    "--gpus-per-task": ("--gpus-per-node", "is not a job spec field; srun mode runs one task per GPU",
                        "use --gpus-per-node N (tasks per node follow it)"),
    "--gres": ("--gpus-per-node", "is not a job spec field; torchslurm asks GPUs per node",
               "use --gpus-per-node N, and --gpu-flag gres to have it rendered as --gres=gpu:N"),
    "--ntasks": _PER_NODE_TASKS, "-n": _PER_NODE_TASKS,
    "--ntasks-per-node": ("--tasks-per-node", "is spelled --tasks-per-node in torchslurm",
                          "use --tasks-per-node N"),
    "--job-name": _NAME, "-J": _NAME,
    "--cpus": ("--cpus-per-task", "is not a Slurm or torchslurm flag; CPUs are asked per task",
               "use --cpus-per-task N"),
    "--cpus-per-gpu": ("--cpus-per-task", "is not a job spec field; srun mode runs one task per GPU",
                       "use --cpus-per-task N (in torchrun mode: N x the workers per node)"),
    "--mem-per-gpu": ("--mem", "is not a job spec field; torchslurm asks memory per node",
                      "use --mem SIZE per node, e.g. --mem 320G for 8 GPUs x 40G"),
    "--mem-per-cpu": ("--mem", "is not a job spec field; torchslurm asks memory per node",
                      "use --mem SIZE per node (memory per CPU x the CPUs of the node's tasks)"),
    "--export": ("--env", "is not a job spec field; torchslurm exports variables one by one",
                 "use --env NAME=VALUE (repeatable)"),
    "--nproc": ("--nproc-per-node", "is spelled --nproc-per-node in job specs (torchrun mode)",
                "use --nproc-per-node N with --launch torchrun"),
    **{short: (long, f"is sbatch's short form of {long}", f"use {long}") for short, long in (
        ("-N", "--nodes"), ("-c", "--cpus-per-task"), ("-t", "--time"), ("-p", "--partition"),
        ("-A", "--account"), ("-q", "--qos"), ("-C", "--constraint"), ("-w", "--nodelist"),
        ("-x", "--exclude"), ("-o", "--output"), ("-e", "--error"), ("-a", "--array"))},
}
# sbatch options with no job spec field (and the spec has no field for raw sbatch options)
SBATCH_ONLY = frozenset({
    "--chdir", "-D", "--mail-type", "--mail-user", "--reservation", "--exclusive", "--dependency", "-d",
    "--begin", "-b", "--licenses", "-L", "--gpu-bind", "--cpu-bind", "--mem-bind", "--hint", "--tmp",
    "--comment", "--nice", "--wckey", "--time-min", "--distribution", "-m", "--switches", "--container",
    "--open-mode", "--mincpus", "--sockets-per-node", "--cores-per-socket", "--threads-per-core",
    "--ntasks-per-core", "--ntasks-per-socket", "--oversubscribe", "-s", "--hold", "-H", "--priority",
    "--get-user-env", "--propagate", "--clusters", "-M", "--gpu-freq", "--cpu-freq", "--network",
    "--deadline", "--kill-on-invalid-dep", "--acctg-freq", "--core-spec", "-S", "--tres-per-task",
    "--ntasks-per-gpu", "--spread-job", "--use-min-nodes", "--wait", "-W", "--test-only",
})


_FOUND_ITSELF = ("is torchrun's; torchslurm finds the master (the node of rank 0) and a free port itself",
                 "drop it; to choose them anyway, set MASTER_ADDR and MASTER_PORT in the environment")
_PER_NODE_RANKS = ("is torchrun's spelling of --nproc", "use --nproc N (ranks on this machine; per node inside an "
                   "allocation)")
# torchrun's own flags (torch.distributed.run) that the commands starting ranks (run, train, doctor,
# bench) do without: flag -> (what it means, what to do).
TORCHRUN_FLAGS: dict[str, tuple[str, str]] = {
    "--nproc-per-node": _PER_NODE_RANKS, "--nproc_per_node": _PER_NODE_RANKS,
    "--nnodes": ("is torchrun's; torchslurm spans the Slurm allocation it runs in (every node of it) and "
                 "this machine alone outside one", "drop it; for N nodes, run it inside `salloc -N N` or an sbatch "
                 "script, or submit with `torchslurm submit --nodes N`"),
    "--standalone": ("is torchrun's; torchslurm picks a free local port itself", "drop it"),
    **{f"--{word}{sep}{rest}": _FOUND_ITSELF for word, rest in (
        ("master", "addr"), ("master", "port"), ("rdzv", "endpoint"), ("rdzv", "backend"), ("rdzv", "id"),
        ("node", "rank")) for sep in "_-"},
}


def torchrun_flag_advice(arg: str, accepted: Collection[str]) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a torchrun flag given to a subcommand that starts ranks (takes --nproc)."""
    flag = flag_name(arg)
    if "--nproc" not in accepted or flag not in TORCHRUN_FLAGS:
        return None
    meaning, hint = TORCHRUN_FLAGS[flag]
    return f"{flag} {meaning}", hint


def flag_name(arg: str) -> str:
    """`--gpus=8` -> `--gpus`, `-n4` -> `-n`."""
    return arg.partition("=")[0] if arg.startswith("--") else arg[:2]


def slurm_flag_advice(arg: str, accepted: Collection[str]) -> tuple[str, str] | None:
    """(what is wrong, the fix) for an sbatch flag that a subcommand taking `accepted` flags refused."""
    flag = flag_name(arg)
    if flag in SLURM_EQUIVALENTS and SLURM_EQUIVALENTS[flag][0] in accepted:
        _, meaning, hint = SLURM_EQUIVALENTS[flag]
        return f"{flag} {meaning}", hint
    if flag in SBATCH_ONLY and "--partition" in accepted:
        return (f"{flag} is an sbatch option that the job spec has no field for (nor one for raw sbatch options)",
                f"render the script (`torchslurm script ... > job.sbatch`), then `sbatch {flag}=... job.sbatch` "
                f"(sbatch's own options win over the script's #SBATCH lines)")
    return None


# Arguments after the script are the script's (as with srun and torchrun). These spec flags are
# Slurm's and almost never a training script's own, so one of them there is a misplaced flag.
_SLURM_FLAGS = frozenset(flag(name) for name in (
    "nodes", "gpus_per_node", "tasks_per_node", "nproc_per_node", "cpus_per_task", "mem", "time", "partition",
    "account", "qos", "constraint", "nodelist", "exclude", "preemptible", "requeue", "max_requeues", "gpu_flag",
    "per_rank_output", "spec", "slurm_version", "no_preemptible", "no_requeue", "no_per_rank_output", "array",
    "grace_s"))


def misplaced_flags(script: str, script_args: Sequence[str]) -> list[Finding]:
    """An error for each of torchslurm's Slurm flags given after the script (the script would get it)."""
    flags = [arg.partition("=")[0] for arg in script_args]
    return [Finding("error", "misplaced-flag", f"{option} comes after {script}, so {script} gets it and the job "
                    "spec does not.", f"put torchslurm's flags before the script ({option} ... "
                    f"{script} ...); if {script} itself takes {option}, give --force before {script}")
            for option in dict.fromkeys(flags) if option in _SLURM_FLAGS]

"""lint rules of the lines that start training in an sbatch script: srun, torchrun, python.

How many ranks each launch line starts per node against the GPUs the `#SBATCH` directives ask for
(allocation.py), a python or launcher without srun, one launcher per node, srun's --kill-on-bad-exit,
a deprecated launcher. How the launchers of a multi-node step rendezvous is rendezvous.py's. Pure,
nothing executed.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchslurm.jobs.interpreter import NV_VARIABLES, runtime_without_gpus
from torchslurm.lint.allocation import leading_int, step_tasks_per_node
from torchslurm.lint.rule import Facts, Flag, rule

__all__: list[str] = []


@rule("deprecated-launch", ("warning",), "`python -m torch.distributed.launch`.")
def deprecated_launch(x: Facts) -> Iterator[Flag]:
    for ln in x.script.launches:
        if ln.launcher == "torch.distributed.launch":
            yield Flag("warning", "python -m torch.distributed.launch is deprecated (it passes --local-rank as an "
                       "argument and is removed in recent torch).",
                       "use torchrun (python -m torch.distributed.run), or srun with one task per GPU.", ln.line)


@rule("python-without-srun", ("error",),
      "the training runs without srun in a multi-task allocation. Data preparation or evaluation next to an srun'd "
      "training step is not reported.")
def python_without_srun(x: Facts) -> Iterator[Flag]:
    a = x.allocation
    if any(ln.under_srun for ln in x.script.launches):
        return  # data preparation before, or evaluation after, an srun'd training step is normal
    for ln in x.script.launches:
        if ln.launcher is None and not ln.under_srun and (a.total_tasks > 1 or a.nodes > 1):
            yield Flag("error", f"`{ln.python} ...` runs once, in the batch shell on the first node, but the "
                       f"allocation has {a.total_tasks} task(s) on {a.nodes} node(s).",
                       f"srun {ln.python} ... (one rank per task), or `torchslurm run`.", ln.line)


@rule("launcher-without-srun", ("error",),
      "torchrun/accelerate without srun on a multi-node job: runs on the first node only (deepspeed, gpt-neox's "
      "deepy.py and `colossalai run --hostfile` are exempt: they reach the nodes themselves over ssh/pdsh).")
def launcher_without_srun(x: Facts) -> Iterator[Flag]:
    nodes = x.allocation.nodes
    for ln in x.script.launches:
        if ln.launcher is not None and not ln.reaches_other_nodes and not ln.under_srun and nodes > 1:
            yield Flag("error", f"{ln.launcher} runs only on the first of {nodes} nodes without srun.",
                       "srun --ntasks-per-node=1 torchrun ... (one launcher per node).", ln.line)


@rule("launcher-per-task", ("error",),
      "srun starts the launcher in several tasks per node (`srun --ntasks=$WORLD_SIZE torchrun --nproc_per_node=4`): "
      "tasks × processes exceed the GPUs.")
def launcher_per_task(x: Facts) -> Iterator[Flag]:
    a = x.allocation
    for ln in x.script.launches:
        step = ln.srun_opts.get("ntasks-per-node")  # srun's own layout; -n $SLURM_NNODES: lint can't count
        per_node = a.tasks if step is None and "ntasks" not in ln.srun_opts else (
            leading_int(step) or step_tasks_per_node(ln, a.nodes) or 1)
        if ln.launcher is not None and ln.under_srun and per_node > 1:
            gpus = a.gpus_per_node
            workers = f" x {ln.nproc_per_node} = {per_node * ln.nproc_per_node} worker(s) per node" + (
                f" on {gpus} GPU(s)" if gpus else "") if ln.nproc_per_node else ""
            yield Flag("error", f"srun starts {ln.launcher} in each of the {per_node} tasks per node, and each "
                       f"starts its own workers{workers}.",
                       "#SBATCH --ntasks-per-node=1 for launcher jobs (or srun -n $SLURM_NNODES "
                       "--ntasks-per-node=1).", ln.line)


@rule("nproc-vs-gpus", ("error",), "a launcher's processes per node ≠ GPUs per node.")
def nproc_vs_gpus(x: Facts) -> Iterator[Flag]:
    gpus = x.allocation.gpus_per_node
    for ln in x.script.launches:
        if ln.launcher is not None and gpus and ln.nproc_per_node is not None and ln.nproc_per_node != gpus:
            yield Flag("error", f"--nproc-per-node={ln.nproc_per_node} but {gpus} GPU(s) per node are allocated.",
                       f"--nproc-per-node={gpus}.", ln.line)


@rule("srun-tasks-vs-gpus", ("error", "warning"),
      "srun's own `--ntasks-per-node` (or `--ntasks`) starts a number of ranks per node other than the GPUs per "
      "node: GPUs stay idle (warning), or ranks share a GPU (error).")
def srun_tasks_vs_gpus(x: Facts) -> Iterator[Flag]:
    a, gpus = x.allocation, x.allocation.gpus_per_node
    for ln in x.script.launches:
        step_tasks = step_tasks_per_node(ln, a.nodes)
        if ln.launcher is not None or not ln.under_srun or not gpus or step_tasks is None or step_tasks == gpus:
            continue
        given = " ".join(f"--{k}={ln.srun_opts[k]}" for k in ("ntasks", "ntasks-per-node") if k in ln.srun_opts)
        if step_tasks < gpus:
            yield Flag("warning", f"srun {given} starts {step_tasks} rank(s) per node, overriding #SBATCH's "
                       f"{a.tasks}, and {gpus - step_tasks} of the {gpus} GPU(s) per node stay idle.",
                       f"srun --ntasks-per-node={gpus} (one rank per GPU), or drop {given} to use the job's layout.",
                       ln.line)
        else:
            yield Flag("error", f"srun {given} starts {step_tasks} rank(s) per node on {gpus} GPU(s) per node: "
                       "ranks share a GPU, which NCCL refuses (\"Duplicate GPU detected\").",
                       f"srun --ntasks-per-node={gpus} (one rank per GPU).", ln.line)


@rule("tasks-vs-gpus", ("error",), "`srun python` starts one rank per task: tasks per node ≠ GPUs per node.")
def tasks_vs_gpus(x: Facts) -> Iterator[Flag]:
    a, gpus = x.allocation, x.allocation.gpus_per_node
    for ln in x.script.launches:
        if (ln.launcher is None and ln.under_srun and gpus and step_tasks_per_node(ln, a.nodes) is None
                and a.tasks != gpus):
            yield Flag("error", f"srun runs one rank per task: {a.tasks} task(s) per node but {gpus} GPU(s) per "
                       "node.", f"#SBATCH --ntasks-per-node={gpus}, or one task per node running torchrun.", ln.line)


@rule("no-kill-on-bad-exit", ("info",),
      "srun without `--kill-on-bad-exit`: survivors wait until the collective timeout.")
def no_kill_on_bad_exit(x: Facts) -> Iterator[Flag]:
    a = x.allocation
    for ln in x.script.launches:
        kill = ln.srun_opts.get("kill-on-bad-exit")
        if ln.under_srun and (a.total_tasks > 1 or a.nodes > 1) and (kill is None or kill.lstrip("=") == "0"):
            who = f"one rank (or one node's {ln.launcher} agent)" if ln.launcher else "one rank"
            yield Flag("info", f"srun without --kill-on-bad-exit: when {who} dies, the others wait in their "
                       "collectives until the group timeout (torch's default: 30 min) and the job holds its nodes "
                       "meanwhile.", "srun --kill-on-bad-exit=1 ... (unless the cluster sets KillOnBadExit=1).",
                       ln.line)


@rule("srun-cpus-per-task", ("warning",),
      "`#SBATCH --cpus-per-task=N` (N > 1) and `srun` without `-c` or `SRUN_CPUS_PER_TASK`: since Slurm 22.05 srun "
      "no longer inherits it, so each task gets one CPU.")
def srun_cpus_per_task(x: Facts) -> Iterator[Flag]:
    """Slurm 22.05 stopped passing the job's --cpus-per-task on to srun (its release notes; srun reads
    SRUN_CPUS_PER_TASK instead): data loader workers then share one CPU."""
    cpus = leading_int(x.script.directives.get("cpus-per-task"))
    if cpus is None or cpus < 2 or "SRUN_CPUS_PER_TASK" in x.script.exported:
        return
    for ln in x.script.launches:
        if ln.under_srun and "cpus-per-task" not in ln.srun_opts and "SRUN_CPUS_PER_TASK" not in ln.env:
            yield Flag("warning", f"#SBATCH --cpus-per-task={cpus}, but this srun does not pass it on: since Slurm "
                       "22.05 srun no longer inherits --cpus-per-task, so each task runs on 1 CPU and data loading "
                       "crawls (older Slurm inherits it).",
                       "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK before srun, or srun -c "
                       "$SLURM_CPUS_PER_TASK ...", ln.line)


@rule("container-without-gpus", ("warning",),
      "a GPU job's training runs in `apptainer`/`singularity exec` without `--nv` (nor `APPTAINER_NV`, `--rocm`): "
      "NVIDIA GPUs stay unseen in the container (AMD GPUs need no flag).")
def container_without_gpus(x: Facts) -> Iterator[Flag]:
    """Apptainer and Singularity pass the host's NVIDIA devices and driver into the container only with --nv
    (or --nvccli); without it torch.cuda.is_available() is False inside, and NCCL finds no device. AMD GPUs
    are seen without a flag (OLMo's LUMI scripts pass none): a warning, not an error."""
    gpus = x.allocation.gpus_per_node
    if not gpus:
        return
    for ln in x.script.launches:
        variable_set = bool(NV_VARIABLES & (x.script.exported | ln.env))
        runtime = runtime_without_gpus(ln.words, variable_set)
        if runtime is not None:
            yield Flag("warning", f"the training runs in {runtime} without --nv: on NVIDIA GPUs the container sees "
                       f"none of the {gpus} per node, so the ranks find no CUDA device (or train on the CPU); AMD GPUs "
                       "need no flag.", f"{runtime} exec --nv IMAGE ... (or export APPTAINER_NV=1 before srun); on "
                       "AMD GPUs, --rocm or nothing", ln.line)

"""The fixed-port rules of `torchslurm lint`, aware of who else can be on the node.

A literal rendezvous or master port (`MASTER_PORT=29500`, `--master-port`, `--rdzv-endpoint=host:29500`,
accelerate's `--main_process_port`, deepspeed's `--master_port`) collides only when something else
binds it on the same node: another job that shares the node, or another step of this job running
at the same time. A torchrun given no port at all uses its default one (29500; 29400 for a c10d endpoint
without a port), which collides the same way. How sharing is decided (docs/lint.md, "Fixed ports"):
- two steps that can overlap (a launch started with `&` next to another one): error;
- not shared: `--exclusive`, `--mem=0` (all of each node's memory), or 8 GPUs per node (no common
  node has more, so the job holds all of them): info, the port is safe;
- anything less than a whole node: warning, as whether other jobs land on the node is the cluster's
  policy (OverSubscribe, whole-node partitions), which lint cannot see.
Pure, nothing executed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from torchslurm.jobs.findings import Severity
from torchslurm.lint.allocation import gpus_per_node, step_nodes
from torchslurm.lint.parse import TORCHRUN_LIKE, Launch, Script
from torchslurm.lint.rule import Facts, Flag, rule
from torchslurm.runtime.ports import RDZV_PORT_EXPR
from torchslurm.runtime.variables import is_digits

__all__ = ["node_sharing"]

WHOLE_NODE_GPUS = 8
"""GPUs per node that mean the job holds the whole node (8-GPU servers are the largest common ones)."""
MAYBE_WHOLE_NODE_GPUS = 4
"""From here up a request is the whole node on 4-GPU clusters."""
TORCHRUN_PORT, C10D_PORT = 29500, 29400
"""torchrun's default --master-port, and the port of a c10d --rdzv-endpoint given without one (torch/distributed)."""

_PORT_HINT = f"derive it from the job id: port={RDZV_PORT_EXPR}, or use `torchslurm script --launch torchrun`"


def node_sharing(s: Script) -> tuple[Severity, str]:
    """How bad a fixed port is for this script's allocation, and why."""
    d = s.directives
    srun_launches = [ln for ln in s.launches if ln.under_srun]
    if len(srun_launches) > 1 and any(ln.background for ln in srun_launches):
        return "error", "two steps of this job run at the same time (`srun ... &`) and both bind it"
    if d.get("exclusive") == "" or d.get("mem", "").upper() in ("0", "0G", "0M"):
        why = "--exclusive" if "exclusive" in d else f"--mem={d['mem']} (all of each node's memory)"
        return "info", f"the job holds whole nodes ({why}), so no other job binds it there"
    gpus = gpus_per_node(d) or 0
    if gpus >= WHOLE_NODE_GPUS:
        return "info", f"the job holds all {gpus} GPUs of each node, so no other job binds it there"
    if gpus >= MAYBE_WHOLE_NODE_GPUS:
        return "warning", (f"{gpus} GPUs per node without --exclusive, so on nodes with more GPUs another job "
                           "can share the node")
    return "warning", ("the job does not hold whole nodes (no --exclusive), so where the cluster shares nodes "
                       "another job can bind it there")


def _flag(x: Facts, line: int, what: str, hint: str) -> Flag:
    severity, why = node_sharing(x.script)
    if severity == "info":
        return Flag("info", f"{what} is fixed; safe here: {why}.", f"to run on shared nodes too, {hint}.", line)
    return Flag(severity, f"{what} is fixed: {why}; the second one to bind it gets EADDRINUSE or joins this job's "
                "rendezvous.", f"{hint}, or #SBATCH --exclusive.", line)


def _default_port(ln: Launch, job_nodes: int, endpoint: str) -> bool:
    """torchrun binds its default port: no port given, and a rendezvous it holds on one node (alone, or named
    by --rdzv-endpoint/--master-addr; a multi-node one with neither is the rendezvous rules' error)."""
    if ln.launcher not in TORCHRUN_LIKE or "master-port" in ln.launcher_opts:
        return False
    return not _has_port(endpoint) and (
        bool(endpoint) or "master-addr" in ln.launcher_opts or step_nodes(ln, job_nodes) == 1)


def _has_port(endpoint: str) -> bool:
    """`host:port` or `[IPv6 address]:port`, not `host`, `[::1]` or `host:`."""
    after_host = endpoint.rpartition("]")[2]
    return ":" in after_host and not after_host.endswith(":")


def _launchers(x: Facts) -> Iterator[Launch]:
    """Launch lines through a launcher that binds a port (--standalone picks a free port itself)."""
    return (ln for ln in x.script.launches if ln.launcher is not None and "standalone" not in ln.launcher_opts)


@rule("fixed-master-port", ("error", "warning", "info"),
      "a literal `MASTER_PORT` or launcher `--master-port`/`--main_process_port`; see \"Fixed ports\" below.")
def fixed_master_port(x: Facts) -> Iterator[Flag]:
    """Every literal master port, each judged by how the node is shared."""
    exports = {**x.script.task_exports, **x.script.exports}
    if "MASTER_PORT" in exports and is_digits(exports["MASTER_PORT"][1]):
        line, value = exports["MASTER_PORT"]
        yield _flag(x, line, f"MASTER_PORT={value}",
                    "remove it: torchslurm.init() derives the port from SLURM_JOB_ID; or " + _PORT_HINT)
    for ln in _launchers(x):
        for key in ("master-port", "main-process-port"):
            if is_digits(ln.launcher_opts.get(key, "")):
                yield _flag(x, ln.line, f"{ln.launcher} --{key}={ln.launcher_opts[key]}",
                            f"--{key}={RDZV_PORT_EXPR} (a port per job)")


@rule("fixed-port", ("error", "warning", "info"),
      "a literal port in `--rdzv-endpoint host:29500`, or torchrun given no port (its default 29500); see "
      "\"Fixed ports\" below.")
def fixed_port(x: Facts) -> Iterator[Flag]:
    for ln in _launchers(x):
        endpoint = ln.rdzv_endpoint or ""
        if re.search(r":[1-9][0-9]*\Z", endpoint):  # `:0`: the OS picks a free port
            yield _flag(x, ln.line, f"{ln.launcher} --rdzv-endpoint={endpoint}", _PORT_HINT)
        elif _default_port(ln, x.allocation.nodes, endpoint):
            c10d = bool(endpoint) and ln.launcher_opts.get("rdzv-backend", "static") != "static"
            given = f"--rdzv-endpoint={endpoint} without a port" if endpoint else "no --master-port"
            yield _flag(x, ln.line, f"{ln.launcher}'s rendezvous port ({given}: its default, "
                        f"{C10D_PORT if c10d else TORCHRUN_PORT})",
                        f"give it one per job: --master-port={RDZV_PORT_EXPR} (or :$port in --rdzv-endpoint), "
                        "or --standalone on a single node (a free port)")

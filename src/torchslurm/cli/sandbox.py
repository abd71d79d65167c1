"""`torchslurm sandbox up|down|status|exec`: a real multi-node Slurm cluster on this machine (root)."""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torchslurm.errors import SlurmError
from torchslurm.sandbox import cluster as sandbox
from torchslurm.sandbox.config import DEFAULT_LAB_DIR


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sandbox", help="a local multi-node Slurm cluster in network namespaces (needs root)",
        description="A real Slurm cluster on this machine: one slurmctld, one slurmd per emulated node "
                    "(own network namespace, hostname and NIC name), fake GPUs as gres. Needs root.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    lab_help = f"the sandbox's directory (default: the running sandbox's, else {DEFAULT_LAB_DIR})"

    p_up = actions.add_parser("up", help="bring the cluster up (installs Slurm with apt-get when missing)")
    p_up.add_argument("--nodes", type=int, default=4, help="compute nodes (default 4)")
    p_up.add_argument("--gpus-per-node", type=int, default=4, help="fake GPUs per node (default 4)")
    p_up.add_argument("--cpus-per-node", type=int, default=4, help="CPUs each node declares (default 4)")
    p_up.add_argument("--lab-dir", type=Path, default=None,
                      help=f"the sandbox's directory (default {DEFAULT_LAB_DIR})")
    p_up.set_defaults(handler=cmd_up)

    p_down = actions.add_parser("down", help="stop its daemons, remove its namespaces, bridge and files")
    p_down.add_argument("--lab-dir", type=Path, default=None, help=lab_help)
    p_down.set_defaults(handler=cmd_down)

    p_status = actions.add_parser("status", help="daemons and node states")
    p_status.add_argument("--lab-dir", type=Path, default=None, help=lab_help)
    p_status.set_defaults(handler=cmd_status)

    p_exec = actions.add_parser("exec", help="run a command on a node (its namespaces): exec node2 ip -br a")
    p_exec.add_argument("--lab-dir", type=Path, default=None, help=lab_help)
    p_exec.add_argument("node", help="node1 .. nodeN")
    p_exec.add_argument("cmd", nargs=argparse.REMAINDER, help="command and arguments")
    p_exec.set_defaults(handler=cmd_exec)


def cmd_up(args: argparse.Namespace) -> int:
    cfg = sandbox.default_config(args.lab_dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                                 cpus_per_node=args.cpus_per_node)
    st = sandbox.up(cfg)
    _print_status(st)
    print("\nPoint sbatch/srun/squeue at it (and run jobs with this project's python):")
    print(f"  source {cfg.env_file}")
    print(f"  # or: export SLURM_CONF={cfg.slurm_conf} PATH={cfg.python_bin}:$PATH")
    print(f"Stop it with: torchslurm sandbox down --lab-dir {cfg.lab_dir}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    removed = sandbox.down(args.lab_dir)
    if not removed:
        print(f"no sandbox in {sandbox.resolve_lab_dir(args.lab_dir)}: nothing to do")
    for item in removed:
        print(f"removed {item}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    st = sandbox.status(args.lab_dir)
    _print_status(st)
    return 0 if st.healthy else 1


def cmd_exec(args: argparse.Namespace) -> int:
    sandbox.require_root()
    argv = sandbox.node_exec_argv(args.node, args.cmd, args.lab_dir)
    return subprocess.run(argv).returncode


def _print_status(st: sandbox.SandboxStatus) -> None:
    if st.config is None:
        print(f"sandbox: not up (no sandbox in {st.lab_dir})")
        return
    cfg = st.config
    print(f"sandbox: {'up' if st.healthy else 'NOT HEALTHY'} in {cfg.lab_dir}: {cfg.nodes} nodes, "
          f"{cfg.gpus_per_node} fake GPUs and {cfg.cpus_per_node} CPUs each")
    for name, pid in st.daemons.items():
        print(f"  {name:<16} {'pid ' + str(pid) if pid else 'not running'}")
    for node, state in sorted(st.node_states.items(), key=lambda kv: int(kv[0].removeprefix("node"))):
        print(f"  {node:<16} {state}")


def unpointed_shell_hint(exc: SlurmError, environ: Mapping[str, str],
                         lab_dir: Callable[[], Path | None] = sandbox.running_lab_dir) -> SlurmError:
    """`exc` (a Slurm command that found no controller) with the hint to source the sandbox's env.sh
    when a sandbox is up and this shell's SLURM_CONF is not its own; `exc` itself otherwise. The
    generic hint would say to bring one up, which is wrong when one is running."""
    from torchslurm.jobs.slurmoutput import controller_unreachable

    running = lab_dir()
    cfg = sandbox.load_config(running) if running is not None else None
    if cfg is None or environ.get("SLURM_CONF") == str(cfg.slurm_conf) or not controller_unreachable(exc.message):
        return exc
    return SlurmError(exc.message, f"a sandbox cluster is up in {cfg.lab_dir}, but this shell is not pointed at "
                      f"it: run `source {cfg.env_file}` (it sets SLURM_CONF and PATH), then retry.")


def hint_sandbox(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A job command's handler whose no-controller errors point at a running sandbox's env.sh."""
    @functools.wraps(handler)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except SlurmError as exc:
            better = unpointed_shell_hint(exc, os.environ)
            if better is exc:
                raise
            raise better from exc
    return wrapped

"""The only place torch.distributed is set up: `torchslurm.init()` and `torchslurm.shutdown()`.

    with torchslurm.init() as ctx:          # or: ctx = torchslurm.init(); ...; torchslurm.shutdown()
        model = DDP(model.to(ctx.device), device_ids=ctx.device_ids)

detect placement → choose device → choose backend → choose NIC → init_process_group with an
explicit timeout → check that every rank joined. This module is the thin effectful shell; the
decisions live in distenv, devices and netif.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import TracebackType

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from torchslurm.errors import ConfigError, DistributedError, not_one_of
from torchslurm.runtime import devices, fdlimit, gpubind, netif, startsignals, storeproof
from torchslurm.runtime.devices import BACKENDS
from torchslurm.runtime.distenv import DistEnv, detect
from torchslurm.runtime.handshake import agree_namespace
from torchslurm.runtime.stackwatch import StackWatch, job_dir

logger = logging.getLogger(__name__)

RUN_PREFIX = "torchslurm/"
"""Where a run's keys go in a store that rank 0 hosts (a new store for every run)."""
DEFAULT_TIMEOUT_S = 300.0
"""How long a rank waits for its peers (at init and in each collective) before failing.

torch's default is 30 minutes for Gloo; a dead peer should not cost that much allocation."""


@dataclass(frozen=True)
class DistContext:
    """What a training script needs after init. Also a context manager that shuts down."""

    env: DistEnv
    """Placement: ranks, nodes, master, launcher and why."""
    device: torch.device
    """The device this rank computes on (cuda:i or cpu)."""
    backend: str
    """The process group backend: 'nccl' or 'gloo'."""
    interface_env: Mapping[str, str]
    """NIC variables torchslurm set for this process (empty when the user set them)."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """The process group timeout: how long a collective waits for a peer that went away."""
    store_prefix: str = RUN_PREFIX
    """This run's namespace in the store at master_addr:master_port (fresh per round under torchrun)."""

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    @property
    def device_ids(self) -> list[int] | None:
        """What DistributedDataParallel's device_ids wants: [index] on CUDA, None on CPU."""
        return [self.device.index or 0] if self.device.type == "cuda" else None

    def __enter__(self) -> DistContext:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        shutdown(wait_for_peers=exc is None)


_watch: StackWatch | None = None
"""This process's `torchslurm stacks` responder: process-wide, like torch.distributed's own group."""


def init(backend: str | None = None, timeout_s: float | None = None,
         environ: MutableMapping[str, str] | None = None, run_dir: str | os.PathLike[str] | None = None) -> DistContext:
    """Initialise torch.distributed for this process, whatever launched it.

    backend: 'nccl' or 'gloo'; default: TORCHSLURM_BACKEND (written by `torchslurm script` from the
    job spec), else NCCL when this rank has a CUDA device, else Gloo.
    timeout_s: how long to wait for peers (default DEFAULT_TIMEOUT_S).
    environ: the process environment (default os.environ); NIC variables are written into it
    because NCCL and Gloo read them from the process environment at init.
    run_dir: a folder (shared by the nodes) through which `torchslurm stacks --run-dir` reaches this
    run's ranks; under Slurm `torchslurm stacks JOB` reaches them without it (runtime.stackwatch).
    """
    environ = os.environ if environ is None else environ
    startsignals.hold(environ)  # the job's warning signal: recorded from now on, for the Trainer's handlers
    if dist.is_available() and dist.is_initialized():
        raise DistributedError(
            "torch.distributed is already initialised in this process.",
            "call torchslurm.init() once, or torchslurm.shutdown() before calling it again."
        )
    env = detect(environ)
    for warning in env.warnings:
        logger.warning("%s", warning)
    device, agree = _device_for(env, environ)
    unseen = devices.gpus_unseen(environ, torch.cuda.device_count(), torch.version.cuda)
    cpus = devices.usable_cpus()
    crowded = devices.cpu_oversubscription(environ, env.gpu_sharers, cpus)
    for problem in (unseen, crowded, devices.cpus_per_task_lost(environ, cpus)):
        if problem is not None and env.local_rank == 0:  # once per node
            logger.warning("rank %d: %s", env.rank, problem)
    if backend is None and environ.get("TORCHSLURM_BACKEND"):
        chosen_backend = choose_backend(environ["TORCHSLURM_BACKEND"], device, setting="TORCHSLURM_BACKEND")
    else:
        chosen_backend = choose_backend(backend, device)
    interface_env = netif.socket_ifname_env(environ, env.master_addr)
    environ.update(interface_env)
    timeout = timedelta(seconds=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
    logger.debug("rank %d: %s device=%s backend=%s nic=%s", env.rank, env.reason, device, chosen_backend,
                 dict(interface_env))
    store_prefix, device = _init_process_group(env, chosen_backend, device, timeout, environ, agree)
    _check_all_joined(env, device)
    _start_stack_watch(env, run_dir)
    return DistContext(env=env, device=device, backend=chosen_backend, interface_env=interface_env,
                       timeout_s=timeout.total_seconds(), store_prefix=store_prefix)


def shutdown(wait_for_peers: bool = True) -> None:
    """Destroy the process group if there is one; safe to call twice.

    By default every rank first waits for the others (after an error the peers may be gone, so
    no waiting). Then unreachable DDP models are collected while the group still exists: with
    3+ Gloo ranks, torch 2.13 aborts about one process in three at exit ("terminate called
    without an active exception") when a DistributedDataParallel outlives its group; a DDP
    model the caller still holds must be deleted before leaving init().
    """
    global _watch
    if _watch is not None:
        _watch.stop()
        _watch = None
    if not (dist.is_available() and dist.is_initialized()):
        return
    if wait_for_peers:
        try:
            dist.barrier()
        except (RuntimeError, OSError) as exc:
            logger.warning("shutdown: not every rank reached the final barrier (%s)", _first_line(exc))
    gc.collect()
    dist.destroy_process_group()


def stack_watch() -> StackWatch | None:
    """The `torchslurm stacks` responder init() started in this process (None before init())."""
    return _watch


def _start_stack_watch(env: DistEnv, run_dir: str | os.PathLike[str] | None) -> None:
    global _watch
    _watch = StackWatch(env.rank, env.world_size, collectives=collectives_issued)
    for folder in ([job_dir(env.job_id, Path.home())] if env.job_id else []) + ([Path(run_dir)] if run_dir else []):
        _watch.add(folder)
    _watch.start()


def collectives_issued() -> int | None:
    """Collectives this rank issued on the default group (its sequence number); read from another
    thread while the main one may be blocked in a collective (a plain counter read in C++)."""
    try:
        group = dist.distributed_c10d._get_default_group()
        return int(group._get_sequence_number_for_group())  # type: ignore[attr-defined]
    except (RuntimeError, ValueError, AttributeError):
        return None


def choose_backend(requested: str | None, device: torch.device, setting: str = "backend") -> str:
    """NCCL for CUDA ranks, Gloo otherwise; an explicit choice is checked against the device.

    `setting` names where the choice came from, for the error message.
    """
    if requested is None:
        return "nccl" if device.type == "cuda" else "gloo"
    if requested not in BACKENDS:
        raise not_one_of(setting, requested, BACKENDS,
                         hint="leave backend unset to pick NCCL on GPUs and Gloo on CPUs.")
    if requested == "nccl" and device.type != "cuda":
        raise ConfigError(
            f"{setting}='nccl' but this rank has no CUDA device (torch.cuda.device_count()="
            f"{torch.cuda.device_count()}). NCCL only runs on GPUs.", "use backend='gloo' on CPU "
            "nodes, or request GPUs from Slurm (--gpus-per-node)."
        )
    return requested


def _device_for(env: DistEnv, environ: Mapping[str, str]) -> tuple[torch.device, bool]:
    """This rank's device, and whether the node's tasks must still agree on it (DeviceChoice.agree)."""
    choice = devices.choose_device(environ, env.local_rank, env.gpu_sharers, torch.cuda.device_count())
    if choice.kind == "cuda":
        torch.cuda.set_device(choice.index)
        return torch.device("cuda", choice.index), choice.agree
    return torch.device("cpu"), False


def _agreed_device(store: Store, env: DistEnv) -> torch.device:
    """The GPU this task takes after the node's tasks told each other which GPUs they see (by UUID)."""
    view = [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
    index = gpubind.agree(store, f"gpu/{socket.gethostname()}", env.local_rank, env.gpu_sharers, view)
    if index is None:
        raise ConfigError(
            f"rank {env.rank} (local task {env.local_rank} of {env.gpu_sharers} on {socket.gethostname()}) sees "
            f"{len(view)} GPU(s), and lower tasks of this node already took every one of them: two NCCL ranks "
            "on one GPU hang or crash.", "request one GPU per task (--gpus-per-task=1, or --gpus-per-node equal "
            "to --ntasks-per-node without --gpu-bind=closest / --accel-bind=g).")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _init_process_group(env: DistEnv, backend: str, device: torch.device, timeout: timedelta,
                        environ: Mapping[str, str], agree: bool = False) -> tuple[str, torch.device]:
    """init_process_group on this run's part of the store; returns that part's prefix and the device
    (agreed with the node's other tasks first when `agree`)."""
    try:
        store, prefix = _store(env, timeout, storeproof.token(environ))
        if agree:
            device = _agreed_device(store, env)
        dist.init_process_group(
            backend=backend, store=store, rank=env.rank, world_size=env.world_size,
            timeout=timeout, device_id=device if device.type == "cuda" else None,
        )
    except (RuntimeError, OSError, TimeoutError, ValueError) as exc:
        raise _unreachable(env, timeout, environ, exc) from exc
    return prefix, device


def _store(env: DistEnv, timeout: timedelta, token: str | None = None) -> tuple[Store, str]:
    """The job's TCPStore (env.hosts_store says whether this process hosts it) and this run's prefix in
    it; with the job's `token`, proven to be this job's first (runtime.storeproof). torchrun's agent
    keeps its store across restarts: restarted workers that read the dead workers' Gloo addresses
    fail with "Connection refused" (the agent store still holds the previous workers' keys), so
    there the ranks agree on a fresh prefix first (torchslurm.runtime.handshake)."""
    if env.hosts_store:
        _room_for_clients(env.world_size)
    store = TCPStore(env.master_addr, env.master_port, env.world_size,
                     is_master=env.hosts_store, timeout=timeout, multi_tenant=True)
    if token is not None and not env.agent_store:
        storeproof.settle(store, env.hosts_store, token, f"{env.master_addr}:{env.master_port}",
                          timeout.total_seconds())
    prefix = (agree_namespace(store, env.rank, env.world_size, timeout.total_seconds()) if env.agent_store
              else RUN_PREFIX)
    return PrefixStore(prefix, store), prefix


def _room_for_clients(world_size: int) -> None:
    """Raise this process's open-file limit so the store it hosts can take every rank's connections."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    chosen = fdlimit.plan(world_size, soft, hard, unlimited=resource.RLIM_INFINITY)
    if chosen.raise_to is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (chosen.raise_to, hard))
    if chosen.warning is not None:
        logger.warning("%s", chosen.warning)


def _check_all_joined(env: DistEnv, device: torch.device) -> None:
    """One all_reduce of ones: every rank is in the group and the backend can move data."""
    ones = torch.ones(1, device=device)
    try:
        dist.all_reduce(ones)
    except (RuntimeError, OSError) as exc:
        shutdown(wait_for_peers=False)
        raise DistributedError(
            f"rank {env.rank} joined the process group but the first all_reduce failed: {exc}.",
            "a peer died during start-up, or the network between nodes drops traffic; "
            "run `torchslurm run` again with -v for each rank's placement."
        ) from exc
    if int(ones.item()) != env.world_size:
        shutdown(wait_for_peers=False)
        raise DistributedError(
            f"rank {env.rank}: {int(ones.item())} rank(s) answered but WORLD_SIZE={env.world_size}.",
            "two jobs share MASTER_ADDR:MASTER_PORT; unset MASTER_PORT so torchslurm derives a "
            "job-unique port."
        )


def _unreachable(env: DistEnv, timeout: timedelta, environ: Mapping[str, str],
                 exc: BaseException) -> DistributedError:
    if env.hosts_store and _port_in_use(exc):
        return port_taken(env, environ, socket.gethostname())
    nic = {k: environ[k] for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k in environ}
    role = "could not start the store on" if env.hosts_store else "could not reach the master at"
    return DistributedError(
        f"rank {env.rank} of {env.world_size} on host {socket.gethostname()} {role} "
        f"{env.master_addr}:{env.master_port} within {timeout.total_seconds():g} s "
        f"(launcher: {env.launcher}; interfaces: {nic or 'chosen by the backend'}): "
        f"{_first_line(exc)}. Placement: {env.reason}",
        "likely causes: the store's host (see Placement) did not start or crashed (look at its log first); "
        "MASTER_ADDR resolves to an address other nodes cannot reach (e.g. 127.0.1.1 in /etc/hosts); "
        "a firewall blocks the port; the port is taken by another job (unset MASTER_PORT); "
        "the ranks disagree on WORLD_SIZE."
    )


def _port_in_use(exc: BaseException) -> bool:
    text = str(exc)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def port_taken(env: DistEnv, environ: Mapping[str, str], host: str) -> DistributedError:
    """The store's host could not listen on master_port: another process holds it (checked by the bind, at once)."""
    port = env.master_port
    fixed = "MASTER_PORT" in environ
    source = f"MASTER_PORT={environ['MASTER_PORT']} is set" if fixed else "torchslurm derived the port from the job id"
    who = "another job or process on this node" if env.job_id is not None else "another process on this machine"
    return DistributedError(
        f"rank {env.rank} could not start the store: port {port} on {host} is already in use, by {who} ({source}).",
        ("unset MASTER_PORT: torchslurm then derives a port unique to each Slurm job and step (or a free one "
         f"locally); or choose a free port. `ss -ltnp 'sport = :{port}'` on {host} shows who holds it.") if fixed else
        (f"set MASTER_PORT to a free port; `ss -ltnp 'sport = :{port}'` on {host} shows who holds {port}."))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].rstrip(".") if text else type(exc).__name__

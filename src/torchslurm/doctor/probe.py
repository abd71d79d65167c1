"""The doctor's effects: look at this machine and try the network, for the pure checks in doctor.

`gather()` records the `Facts` the checks read (this host's interfaces, what MASTER_ADDR and
the step's first node resolve to, the route to the master, InfiniBand devices, torch's
versions, which Slurm commands are on PATH, whether slurmctld answers). `check_connect()`
really joins the process group and times one all_reduce. torch is imported lazily here: the
doctor runs on a login node without it.
"""

from __future__ import annotations

import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path

from torchslurm.doctor import checks as doctor
from torchslurm.doctor import facts
from torchslurm.doctor.facts import Check, Facts, TorchFacts
from torchslurm.errors import EnvError, SlurmError, TorchSlurmError
from torchslurm.jobs import slurm
from torchslurm.runtime import devices, netif

__all__ = ["check_connect", "gather"]

PING_TIMEOUT_S = 30.0


def gather(environ: Mapping[str, str], which: Callable[[str], str | None] | None = None) -> Facts:
    """Record this host's facts. torch is imported here (lazily): the doctor runs without it."""
    environ = dict(environ)
    which = which or (lambda name: shutil.which(name, path=environ.get("PATH", "")))
    torch_facts, torch_error = _torch_facts()
    master_ips: tuple[str, ...] = ()
    resolve_error: EnvError | None = None
    source = None
    env = facts.placement(environ)
    if env is not None:
        try:
            master_ips = tuple(netif.resolve(facts.master_name(env, environ)))
        except EnvError as exc:
            resolve_error = exc
        source = next((s for s in map(netif.source_address, master_ips) if s is not None), None)
    first = facts.first_node(env, environ) if env is not None else None
    try:
        first_ips = tuple(netif.resolve(first)) if first else ()
    except EnvError:
        first_ips = ()
    infiniband = Path("/sys/class/infiniband")
    return Facts(
        environ=environ, hostname=socket.gethostname(), torch=torch_facts, torch_error=torch_error,
        interfaces=tuple(netif.list_interfaces()), master_ips=master_ips, resolve_error=resolve_error,
        source=source, own_addresses=tuple(netif.own_addresses()), first_node_ips=first_ips,
        infiniband=tuple(sorted(p.name for p in infiniband.iterdir())) if infiniband.is_dir() else (),
        commands={name: which(name) for name in doctor.SLURM_COMMANDS}, python=sys.executable,
        usable_cpus=devices.usable_cpus(),
        controller=_ping_controller(which("scontrol"), environ) if env is None or env.local_rank == 0 else None,
        excluded_nodes=_excluded_nodes(which("scontrol"), environ) if env is not None and env.local_rank == 0 else None,
    )


def _excluded_nodes(scontrol: str | None, environ: Mapping[str, str]) -> str | None:
    """This job's ExcNodeList ('' when none); None outside a job, without scontrol, or when Slurm does not answer."""
    job = environ.get("SLURM_JOB_ID")
    if scontrol is None or not job:
        return None
    try:
        return slurm.SlurmClient(environ=environ).status(job).excluded
    except SlurmError:
        return None


def check_connect(environ: MutableMapping[str, str], backend: str | None = None, timeout_s: float = 30.0) -> Check:
    """Really join the process group (short timeout) and time one all_reduce."""
    try:
        import torch
        import torch.distributed as dist

        from torchslurm.runtime import distributed
    except ImportError as exc:
        return Check("connect", "error", f"cannot connect without torch ({exc}).", "install torch.")
    start = time.perf_counter()
    try:
        ctx = distributed.init(backend=backend, timeout_s=timeout_s, environ=environ)
    except TorchSlurmError as exc:
        check = facts.from_error("connect", exc)
        return Check(check.name, check.status, check.detail, f"{check.hint} {doctor.DEBUG_HINT}.".strip())
    try:
        joined_s = time.perf_counter() - start
        value = torch.ones(1, device=ctx.device)
        t0 = time.perf_counter()
        dist.all_reduce(value)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        reduce_ms = (time.perf_counter() - t0) * 1e3
        nic = ctx.interface_env.get("GLOO_SOCKET_IFNAME") or environ.get("GLOO_SOCKET_IFNAME", "?")
        return Check("connect", "ok", f"rank {ctx.rank} of {ctx.world_size} joined {ctx.env.master_addr}:"
                     f"{ctx.env.master_port} over {ctx.backend} (interface {nic}) in {joined_s:.2f} s; one "
                     f"all_reduce took {reduce_ms:.2f} ms and summed to {int(value.item())}.", value=ctx.backend)
    finally:
        distributed.shutdown()


def _ping_controller(scontrol: str | None, environ: Mapping[str, str]) -> tuple[int, str] | None:
    """`scontrol ping` (its exit code, stdout + stderr); None without scontrol."""
    if scontrol is None:
        return None
    try:
        # a SlurmctldHost that does not resolve costs scontrol 20 s of retries before it says DOWN
        result = slurm.run_command([scontrol, "ping"], timeout_s=PING_TIMEOUT_S, env=environ)
    except SlurmError as exc:
        return 124, str(exc)
    return result.returncode, result.stdout + result.stderr


def _torch_facts() -> tuple[TorchFacts | None, str]:
    """What the installed torch offers, or (None, why) when it cannot be imported."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return None, str(exc)
    nccl = None
    if dist.is_available() and dist.is_nccl_available():
        try:
            raw = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            nccl = ".".join(map(str, raw)) if isinstance(raw, tuple) else str(raw)
        except (RuntimeError, AttributeError):
            nccl = "available"
    return TorchFacts(version=str(torch.__version__), cuda=torch.version.cuda,
                      cuda_device_count=int(torch.cuda.device_count()), nccl=nccl,
                      gloo=bool(dist.is_available() and dist.is_gloo_available())), ""

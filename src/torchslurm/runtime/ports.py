"""The master port: fixed by MASTER_PORT, derived from the Slurm job and step, or free on loopback.

A derived port is the same on every node of a step without any exchange, and different for every
job and step that may share a node."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping

from torchslurm.errors import EnvError
from torchslurm.runtime.variables import whole_number

# Derived ports stay below Linux's ephemeral range (32768-60999 by default), where the kernel
# hands out client ports, and above the well-known/registered-service crowd.
PORT_BASE = 10000
PORT_SPAN = 32768 - PORT_BASE
# Each job gets STEP_SLOTS consecutive ports, one per step id (mod STEP_SLOTS): jobs whose ids
# are less than PORT_SPAN // STEP_SLOTS apart never collide, nor do ids that share their last
# digits (Lightning derives its port from the last 4 digits and collides there).
STEP_SLOTS = 8
# derived_port(job, step 0) as bash arithmetic, for job scripts and hints: a fixed port (torchrun's
# 29500) lets two jobs sharing a node join each other's store. (bash evaluates `*` and `%` left to right.)
RDZV_PORT_EXPR = f"$(({PORT_BASE} + SLURM_JOB_ID * {STEP_SLOTS} % {PORT_SPAN}))"


def find_free_port() -> int:
    """A TCP port that is free on loopback right now (for single-machine runs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def derived_port(job_id: str, step_id: str | None) -> int:
    """A port unique to (job, step) on a shared node; see PORT_BASE/STEP_SLOTS."""
    job = whole_number("SLURM_JOB_ID", job_id)
    step = int(step_id) if step_id and step_id.isascii() and step_id.isdigit() else STEP_SLOTS - 1
    return PORT_BASE + (job * STEP_SLOTS + step % STEP_SLOTS) % PORT_SPAN


def port_number(value: str) -> int:
    port = whole_number("MASTER_PORT", value)
    if not 1 <= port <= 65535:
        raise EnvError(f"MASTER_PORT={port} is not a TCP port (1-65535).",
                       "unset MASTER_PORT to let torchslurm derive a job-unique port.")
    return port


def master_port(environ: Mapping[str, str], free_port: Callable[[], int]) -> int:
    if "MASTER_PORT" in environ:
        return port_number(environ["MASTER_PORT"])
    if "SLURM_JOB_ID" in environ:
        return derived_port(environ["SLURM_JOB_ID"], environ.get("SLURM_STEP_ID"))
    return free_port()

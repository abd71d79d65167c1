"""The master port: fixed by MASTER_PORT, derived from the Slurm job and step, or free on loopback.

A derived port is the same on every node of a step without any exchange, and different for every
job and step that may share a node. A job that torchslurm submits carries a secret of its own
(JOB_SECRET, made by its script when it starts), and its port is derived from that instead: a
port derived from the job id alone is one every other user of the node can compute, and bind
first. Such ports collide between two jobs only by chance (about 1 in 20,000 per pair of steps on
one node; the store's host then reports the port in use). docs/security.md says what this does
and does not protect."""

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
JOB_SECRET = "TORCHSLURM_JOB_SECRET"
"""A job's secret: 32 hex digits its script draws from /dev/urandom when it starts, in the
environment of its processes only (which other users cannot read)."""
MAKE_JOB_SECRET = f'export {JOB_SECRET}="$(od -An -N16 -tx1 /dev/urandom | tr -d \' \\n\')"'
"""The job script's line that makes the secret."""
SECRET_PORT_EXPR = f"$(({PORT_BASE} + 16#${{{JOB_SECRET}:0:8}} % {PORT_SPAN}))"
"""secret_port(the secret, step 0) as bash arithmetic: the rendezvous port of a job torchslurm submits."""


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


def job_secret(environ: Mapping[str, str]) -> str | None:
    """The job's secret (JOB_SECRET), checked; None when the job has none."""
    secret = environ.get(JOB_SECRET)
    if secret is None:
        return None
    if len(secret) < 16 or not all(c in "0123456789abcdef" for c in secret):
        raise EnvError(f"{JOB_SECRET}={secret[:40]!r} is not a job secret: expected 16 or more lower-case hex "
                       "digits, as torchslurm's job scripts make them.",
                       f"unset {JOB_SECRET}; a script from `torchslurm submit` or `torchslurm script` sets it.")
    return secret


def secret_port(secret: str, step_id: str | None) -> int:
    """The port of a step of the job whose secret is `secret`: unpredictable without the secret."""
    step = int(step_id) if step_id and step_id.isascii() and step_id.isdigit() else STEP_SLOTS - 1
    return PORT_BASE + (int(secret[:8], 16) + step) % PORT_SPAN


def slurm_port(environ: Mapping[str, str]) -> int:
    """The port of this Slurm step when MASTER_PORT is unset: from the job's secret, else its id."""
    secret = job_secret(environ)
    if secret is not None:
        return secret_port(secret, environ.get("SLURM_STEP_ID"))
    return derived_port(environ.get("SLURM_JOB_ID", "0"), environ.get("SLURM_STEP_ID"))


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
        return slurm_port(environ)
    return free_port()

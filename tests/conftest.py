"""Fixtures shared by every test directory."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# No per-example deadline: on a loaded 2-core CI machine one slow example (a GC pass, a descheduled
# process) is not a bug, and hypothesis would report it as a flaky failure.
settings.register_profile("torchslurm", deadline=None)
settings.load_profile("torchslurm")

WITHOUT_TORCH = Path(__file__).parent / "fixtures" / "without_torch.py"


@pytest.fixture
def terminal_sigint() -> Iterator[None]:
    """SIGINT as an interactive terminal has it, for the tests of Ctrl-C: Python's KeyboardInterrupt
    handler in this process (restored afterwards), so that child processes start with SIGINT at its
    default action too. pytest started in the background (`nohup pytest … &`, a CI runner) inherits
    SIGINT ignored: Python then installs no handler, Preemption leaves SIGINT alone, and every child
    inherits it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


@pytest.fixture
def without_torch() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `torchslurm ARGS…` (or `-c CODE`) in a fresh interpreter where `import torch` fails."""

    def run(*args: str, cwd: Path | None = None, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(WITHOUT_TORCH), *args], capture_output=True, text=True,
                              timeout=60, cwd=cwd, env={"PATH": path})

    return run


@pytest.fixture
def free_port() -> Callable[[], int]:
    """Pick a port nothing listens on, below the ephemeral range (32768+): a client that retries a
    connect to it can never get it as its own source port and connect to itself."""

    def pick() -> int:
        for port in random.sample(range(20000, 32000), 200):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
        raise RuntimeError("no free port in 20000-31999")

    return pick

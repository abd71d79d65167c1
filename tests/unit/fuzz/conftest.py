"""Shared by the fuzz tests: how a parser may answer hostile text, and how long the fuzzing may take."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from hypothesis import HealthCheck, settings

from torchslurm.errors import ConfigError, TorchSlurmError

T = TypeVar("T")

FUZZ = settings(max_examples=int(os.environ.get("TORCHSLURM_FUZZ_EXAMPLES", "100")), deadline=timedelta(seconds=2),
                suppress_health_check=[HealthCheck.too_slow])
"""Bounded: every parser fuzzed this way is linear in small inputs, so the suite takes seconds; a case that
took two seconds would be a parser gone super-linear (Hypothesis runs it again before it reports it).
TORCHSLURM_FUZZ_EXAMPLES=5000 fuzzes longer, by hand."""


def answered(call: Callable[[], T]) -> T | None:
    """`call()`'s value, or None when it refused with a TorchSlurmError that has a HINT (each of its problems
    has one) and a message short
    enough to print. Any other exception (a traceback for the user) fails the test."""
    try:
        return call()
    except TorchSlurmError as exc:
        each = exc.problems if isinstance(exc, ConfigError) else (exc,)  # several at once: a HINT each
        assert all(problem.hint for problem in each), f"no HINT in: {exc}"
        assert len(str(exc)) < 20_000, f"a message of {len(str(exc))} characters"
        return None

"""Errors a user can act on. The CLI prints them as `error: ...` without a traceback.

Every message says what was set, the rule it broke, then `HINT:` with the exact fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class TorchSlurmError(Exception):
    """Base class: an expected failure whose message is meant for the user.

    `exit_code` is what the CLI exits with (2 = usage/configuration; a failed rank's own code
    when a launched rank failed).
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ConfigError(TorchSlurmError, ValueError):
    """A value given by the user (flag, config file, job spec) is invalid.

    `problems`: one message per invalid value when several are reported at once (see `combined`).
    """

    def __init__(self, message: str, exit_code: int = 2, problems: Sequence[str] = ()) -> None:
        super().__init__(message, exit_code)
        self.problems = tuple(problems) or (message,)

    @classmethod
    def combined(cls, problems: Sequence[str]) -> ConfigError:
        """One error for every invalid value, each on its own line, so that all are fixed in one go."""
        assert problems, "combined() needs at least one problem"
        if len(problems) == 1:
            return cls(problems[0])
        return cls(f"{len(problems)} invalid settings:\n  " + "\n  ".join(problems), problems=problems)

    @classmethod
    def raise_any(cls, problems: Iterable[str | None]) -> None:
        """Raise `combined` of the problems found (None: that check passed); nothing when none were."""
        found = [p for p in problems if p]
        if found:
            raise cls.combined(found)


class EnvError(TorchSlurmError):
    """The process environment (launcher or Slurm variables) is inconsistent."""


class HostlistError(ConfigError):
    """A Slurm hostlist expression that Slurm itself would reject."""


class SlurmError(TorchSlurmError):
    """A Slurm command failed or printed something we cannot parse."""


class CheckpointError(TorchSlurmError):
    """A checkpoint is missing, incomplete or unreadable."""


class DistributedError(TorchSlurmError):
    """torch.distributed could not be set up or a peer failed."""

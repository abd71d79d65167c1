"""Errors a user can act on. The CLI prints them as `error: ...` without a traceback.

An error is data: `message` says what was set and the rule it broke, `hint` the exact fix. They
are joined into one text in one place (`render`), and nothing parses a hint back out of a text.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Sequence

from torchslurm.exitcodes import USAGE_EXIT_CODE


class _Short(reprlib.Repr):
    """repr() cut to a length a message can hold; an integer too long for repr() is described instead."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring, self.maxother, self.maxlong = 200, 200, 60
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = 8
        self.maxlevel = 3

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 200:  # past ~60 digits; repr() itself refuses past 4300
            return f"<an integer of about {int(x.bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)


_SHORT = _Short()


def shown(value: object) -> str:
    """repr(value) for a message, cut short: a value read from a file or a flag may be huge (a
    megabyte of text, a list that YAML aliases repeat a million times), and its message must not be."""
    return _SHORT.repr(value)


def render(message: str, hint: str | None) -> str:
    """The one way a message and its hint are shown to a user."""
    return f"{message} HINT: {hint}" if hint else message


class TorchSlurmError(Exception):
    """Base class: an expected failure whose message is meant for the user.

    `exit_code` is what the CLI exits with (2 = usage/configuration; a failed rank's own code
    when a launched rank failed).
    """

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int = USAGE_EXIT_CODE) -> None:
        super().__init__(render(message, hint))
        self.message = message
        self.hint = hint
        self.exit_code = exit_code


class ConfigError(TorchSlurmError, ValueError):
    """A value given by the user (flag, config file, job spec) is invalid.

    `problems`: one error per invalid value when several are reported at once (see `combined`).
    """

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int = USAGE_EXIT_CODE,
                 problems: Sequence[ConfigError] = ()) -> None:
        super().__init__(message, hint, exit_code=exit_code)
        self.problems: tuple[ConfigError, ...] = tuple(problems) or (self,)

    @classmethod
    def combined(cls, problems: Sequence[ConfigError]) -> ConfigError:
        """One error for every invalid value, each on its own line, so that all are fixed in one go."""
        assert problems, "combined() needs at least one problem"
        if len(problems) == 1:
            return problems[0]
        lines = "\n  ".join(str(p) for p in problems)
        return cls(f"{len(problems)} invalid settings:\n  {lines}", problems=problems)

    @classmethod
    def raise_any(cls, problems: Iterable[ConfigError | None]) -> None:
        """Raise `combined` of the problems found (None: that check passed); nothing when none were."""
        found = [p for p in problems if p is not None]
        if found:
            raise cls.combined(found)


def not_one_of(what: str, value: object, choices: Iterable[object], hint: str | None = None) -> ConfigError:
    """The one phrasing for a value outside a fixed set: `what=value` is not one of the choices."""
    listed = ", ".join(str(c) for c in choices)
    return ConfigError(f"{what}={shown(value)} is not one of {listed}.", hint or f"set {what} to one of: {listed}.")


def below_minimum(what: str, value: object, minimum: object, hint: str | None = None) -> ConfigError:
    """The one phrasing for a number under its minimum: `what=value` must be at least `minimum`."""
    return ConfigError(f"{what}={shown(value)} must be at least {minimum}.",
                       hint or f"set {what} to {minimum} or more.")


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


class UserCodeError(TorchSlurmError):
    """The code a user gave the Trainer (model, loss_fn, step) raised on a rank: their bug, not a
    distributed failure (train.usercode). Exit code 1, as a failed rank."""

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int = 1) -> None:
        super().__init__(message, hint, exit_code=exit_code)

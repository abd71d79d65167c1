"""How a message names a job spec field: as the key of a spec file or as the flag that set it.

A field is spelled the same everywhere (`gpus_per_node` in a spec file, `--gpus-per-node` on the
command line), so a message about it is written once, naming the field through a `Spelling`: the
Python API and spec files get `gpus_per_node=4` / `set gpus_per_node: 4`, the command line gets
`--gpus-per-node=4` / `set --gpus-per-node 4` for the fields it gave as flags.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

_SPLIT_OR_EXPANDED = re.compile(r"[\s'$`\\;&|<>()*?\[\]{}!#~]")


@dataclass(frozen=True)
class Spelling:
    """Names fields as spec-file keys, except those in `flags`, which are named as command-line flags."""

    flags: frozenset[str] = frozenset()

    def name(self, field: str) -> str:
        """`gpus_per_node`, or `--gpus-per-node` for a flag."""
        return flag(field) if field in self.flags else field

    def given(self, field: str, value: object) -> str:
        """What was set: `requeue=false`, `nodes=0`; `--no-requeue`, `--nodes=0` for a flag."""
        if field in self.flags and isinstance(value, bool):
            return flag(field, value)
        return f"{self.name(field)}={_text(value)}"

    def setting(self, field: str, value: object) -> str:
        """How to set it: `tasks_per_node: 4`, `requeue: true`; `--tasks-per-node 4`, `--requeue` for a flag
        (its value quoted as a shell needs it: `--python 'apptainer exec --nv image.sif python'`)."""
        if field not in self.flags:
            return f"{field}: {_text(value)}"
        return flag(field, value) if isinstance(value, bool) else f"{flag(field)} {_shell_word(_text(value))}"


SPEC_FILE = Spelling()
"""Every field named as a spec-file key: the Python API and spec files."""


def command_line(fields: Iterable[str]) -> Spelling:
    """The spelling of a command whose `fields` were given as flags (or are left to their defaults)."""
    return Spelling(frozenset(fields))


def flag(field: str, value: object = True) -> str:
    """The command-line flag of a field: `--gpus-per-node`; `--no-requeue` for a boolean set to false."""
    return ("--no-" if value is False else "--") + field.replace("_", "-")


def _text(value: object) -> str:
    """A value as a spec file writes it (YAML's true/false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _shell_word(text: str) -> str:
    """`text` as one word of a command line: quoted where a shell would split or expand it (a template
    such as `"..."` stays as it is)."""
    return shlex.quote(text) if _SPLIT_OR_EXPANDED.search(text) or not text else text

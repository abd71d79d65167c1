"""Slurm's own spellings of values: a time limit (--time), a memory size (--mem), an array range
(--array), a version (what `sbatch --version` prints). Pure. Patterns are checked with fullmatch
(`$` also matches before a final newline) and spell digits [0-9], as `\\d` takes any script's digits."""

from __future__ import annotations

import re

from torchslurm.errors import ConfigError, shown
from torchslurm.jobs.spelling import Spelling

ARRAY_PATTERN = re.compile(r"[0-9]+(-[0-9]+)?(:[0-9]+)?(,[0-9]+(-[0-9]+)?(:[0-9]+)?)*(%[0-9]+)?")
# Slurm --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (days, then up to three numbers of at most 9 digits)
TIME_PATTERN = re.compile(r"(?:([0-9]{1,9})-)?([0-9]{1,9})(?::([0-9]{1,9}))?(?::([0-9]{1,9}))?")
MEM_PATTERN = re.compile(r"[0-9]+[KMGT]?")


def parse_time(text: str, what: str = "time") -> int:
    """Slurm's --time formats to seconds: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S. `what` names the value in errors."""
    m = TIME_PATTERN.fullmatch(text.strip())
    if not m:
        raise ConfigError(f"{what}={shown(text)} is not a Slurm time limit.",
                          "use minutes (`90`), `H:MM:SS` (`1:30:00`) or `D-HH:MM:SS` (`1-00:00:00`).")
    days, a, b, c = m.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-H, D-H:M, D-H:M:S
        h, mi, s = [*nums, 0, 0][:3]
        return int(days) * 86400 + h * 3600 + mi * 60 + s
    if len(nums) == 1:
        return nums[0] * 60
    if len(nums) == 2:
        return nums[0] * 60 + nums[1]
    return nums[0] * 3600 + nums[1] * 60 + nums[2]


def parse_slurm_version(text: str) -> tuple[int, int]:
    """`slurm-wlm 22.05.8`, `slurm 23.11.1` or `22.05` -> (22, 5)."""
    m = re.search(r"([0-9]{1,9})\.([0-9]{1,9})", text)
    if not m:
        raise ConfigError(f"slurm version {shown(text)} has no MAJOR.MINOR.",
                          "pass what `sbatch --version` prints, e.g. `slurm 22.05.8`.")
    return int(m.group(1)), int(m.group(2))


def mem_problem(mem: str, sp: Spelling) -> ConfigError | None:
    if MEM_PATTERN.fullmatch(mem):
        return None
    return ConfigError(f"{sp.name('mem')}={shown(mem)} is not a Slurm memory size.",
                       f"write e.g. {sp.setting('mem', '32G')} (a number with optional K, M, G or T; 0 means all "
                       "memory of the node).")


def array_problem(array: str, sp: Spelling) -> ConfigError | None:
    if ARRAY_PATTERN.fullmatch(array):
        return None
    examples = [sp.setting("array", a) for a in ("0-9", "1,3,5", "0-15%4")]
    return ConfigError(f"{sp.name('array')}={shown(array)} is not a Slurm array range.",
                       f"write e.g. {examples[0]}, {examples[1]} or {examples[2]}.")

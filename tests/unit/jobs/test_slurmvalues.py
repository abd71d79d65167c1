"""jobs.slurmvalues: Slurm's spellings of a time limit, a memory size, an array range and a version."""

from __future__ import annotations

import pytest

from torchslurm.errors import ConfigError
from torchslurm.jobs.slurmvalues import array_problem, mem_problem, parse_slurm_version, parse_time
from torchslurm.jobs.spelling import SPEC_FILE, command_line


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 5400), ("0:30", 30), ("1:30:00", 5400), ("2-00", 172800), ("1-02:03", 93780),
    ("1-02:03:04", 93784), ("0-04:00:00", 14400),
])
def test_parse_time(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds




def test_a_slurm_version_with_other_digits_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"has no MAJOR.MINOR"):
        parse_slurm_version("slurm ٢٢.٠٥")



@pytest.mark.parametrize(("text", "version"), [("slurm-wlm 22.05.8", (22, 5)), ("slurm 23.11.1", (23, 11)),
                                               ("22.05", (22, 5))])
def test_slurm_version_as_sbatch_prints_it(text: str, version: tuple[int, int]) -> None:
    assert parse_slurm_version(text) == version
    with pytest.raises(ConfigError, match=r"slurm version 'slurm' has no MAJOR\.MINOR\. HINT: pass what"):
        parse_slurm_version("slurm")



@pytest.mark.parametrize(("text", "seconds"), [("2:30", 150), ("1:02:03", 3723), ("3-4:05", 273900)])
def test_parse_time_reads_every_place_of_a_time(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds



@pytest.mark.parametrize("text", ["", " ", "-", "1-", "-5", "1:2:3:4"])
def test_parse_time_refuses_what_is_not_a_time_naming_the_value(text: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_time(text)
    assert str(raised.value) == (f"time={text!r} is not a Slurm time limit. HINT: use minutes (`90`), `H:MM:SS` "
                                 "(`1:30:00`) or `D-HH:MM:SS` (`1-00:00:00`).")
    with pytest.raises(ConfigError, match=rf"^--time={text!r} is not"):
        parse_time(text, "--time")



@pytest.mark.parametrize("mem", ["0", "32G", "512", "64M", "1T", "2K"])
def test_slurm_memory_sizes_pass(mem: str) -> None:
    assert mem_problem(mem, SPEC_FILE) is None


def test_a_memory_size_slurm_cannot_read_is_refused_whole_in_both_spellings() -> None:
    problem = mem_problem("32GB", SPEC_FILE)
    assert problem is not None and (problem.message, problem.hint) == (
        "mem='32GB' is not a Slurm memory size.",
        "write e.g. mem: 32G (a number with optional K, M, G or T; 0 means all memory of the node).")
    problem = mem_problem("g", command_line(["mem"]))
    assert problem is not None and problem.message == "--mem='g' is not a Slurm memory size."


@pytest.mark.parametrize("array", ["0-9", "1,3,5", "0-15%4", "0-30:3", "2"])
def test_slurm_array_ranges_pass(array: str) -> None:
    assert array_problem(array, SPEC_FILE) is None


def test_an_array_range_slurm_cannot_read_is_refused_whole() -> None:
    problem = array_problem("0..9", SPEC_FILE)
    assert problem is not None and (problem.message, problem.hint) == (
        "array='0..9' is not a Slurm array range.", "write e.g. array: 0-9, array: 1,3,5 or array: 0-15%4.")

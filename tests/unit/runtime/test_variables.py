"""Reading launcher variables strictly: every refusal names the variable, its value and the fix."""

from __future__ import annotations

import pytest

from torchslurm.errors import EnvError
from torchslurm.runtime.variables import check_rank, first_number, first_set, is_digits, require, whole_number


@pytest.mark.parametrize(("value", "number"), [("7", 7), (" 12 ", 12), ("-1", -1), ("+3", 3)])
def test_whole_numbers_as_slurm_writes_them(value: str, number: int) -> None:
    assert whole_number("SLURM_PROCID", value) == number


@pytest.mark.parametrize("value", ["12_0", "٣", "3.0", "", "0x10", "three", "9" * 5001])
def test_what_int_would_take_or_misread_is_refused(value: str) -> None:
    with pytest.raises(EnvError, match=rf"SLURM_PROCID={value!r} is not an integer") as info:
        whole_number("SLURM_PROCID", value)
    assert info.value.hint == "unset SLURM_PROCID or set it to a whole number."


def test_the_first_spelling_that_is_set_wins() -> None:
    environ = {"SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "2"}
    assert first_set(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") == "2"
    assert first_set({"SLURM_NTASKS": "4"}, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") == "4"
    assert first_set({}, "SLURM_NNODES", default="1") == "1"
    with pytest.raises(EnvError) as info:
        first_set({}, "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    assert str(info.value) == ("none of SLURM_NNODES, SLURM_JOB_NUM_NODES is set. HINT: srun sets them in every "
                               "task; start the program with srun, not with a partial copy of a Slurm environment.")


def test_half_a_set_names_what_is_missing_and_what_is_there() -> None:
    with pytest.raises(EnvError, match=r"torchrun, but WORLD_SIZE not set \(RANK=1\): half a torchrun") as info:
        require({"RANK": "1"}, ("RANK", "WORLD_SIZE"), "torchrun", "start it with torchrun")
    assert info.value.hint == "start it with torchrun"
    require({"RANK": "1", "WORLD_SIZE": "2"}, ("RANK", "WORLD_SIZE"), "torchrun", "")
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    with pytest.raises(EnvError) as info:
        require({"RANK": "1", "LOCAL_RANK": "0"}, names, "torchrun", "")
    assert str(info.value) == ("torchrun, but WORLD_SIZE, LOCAL_WORLD_SIZE not set (RANK=1, LOCAL_RANK=0): half a "
                               "torchrun environment.")
    with pytest.raises(EnvError) as info:
        require({}, names[:2], "torchrun", "")
    assert info.value.message == "torchrun, but RANK, WORLD_SIZE not set (none of them): half a torchrun environment."


def test_ranks_lie_inside_their_size() -> None:
    check_rank("RANK", 3, "WORLD_SIZE", 4)
    check_rank("RANK", 0, "WORLD_SIZE", 1)  # the smallest world: one rank, rank 0
    with pytest.raises(EnvError) as info:
        check_rank("RANK", 4, "WORLD_SIZE", 4)
    assert str(info.value) == ("RANK=4 is outside 0..3 (WORLD_SIZE=4). HINT: the launcher's variables disagree; do "
                               "not set rank variables by hand in job scripts.")
    with pytest.raises(EnvError, match=r"^RANK=-1 is outside 0..3 \(WORLD_SIZE=4\)"):
        check_rank("RANK", -1, "WORLD_SIZE", 4)
    with pytest.raises(EnvError) as info:
        check_rank("RANK", 0, "WORLD_SIZE", 0)
    assert str(info.value) == "WORLD_SIZE=0 must be at least 1. HINT: check the launcher's arguments."


@pytest.mark.parametrize(("text", "digits"), [
    ("0", True), ("4096", True), ("9" * 18, True),
    ("", False), ("²", False), ("٣", False), ("12\n", False), (" 1", False), ("-1", False), ("9" * 19, False),
])
def test_is_digits_takes_ascii_digits_only(text: str, digits: bool) -> None:
    """str.isdigit() says yes to `²` (int() refuses it) and `٣` (int() reads 3, Slurm does not)."""
    assert is_digits(text) is digits


def test_the_first_number_set_is_read_and_named_in_its_error() -> None:
    environ = {"SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "2"}
    assert first_number(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1) == 2
    assert first_number({"SLURM_NTASKS": "4"}, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1) == 4
    assert first_number({}, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1) == 1
    with pytest.raises(EnvError, match=r"^SLURM_NTASKS='x' is not an integer\."):
        first_number({"SLURM_NTASKS": "x"}, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1)

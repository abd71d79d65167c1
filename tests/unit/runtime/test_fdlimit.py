import pytest

from torchslurm.runtime import fdlimit

UNLIMITED = -1


def test_enough_already_changes_nothing() -> None:
    assert fdlimit.plan(64, soft=1024, hard=4096) == fdlimit.FdPlan(None, None)
    assert fdlimit.plan(4096, soft=UNLIMITED, hard=UNLIMITED, unlimited=UNLIMITED) == fdlimit.FdPlan(None, None)


@pytest.mark.parametrize(("hard", "unlimited"), [(1 << 20, UNLIMITED), (UNLIMITED, UNLIMITED)])
def test_a_soft_limit_below_the_need_is_raised_to_it(hard: int, unlimited: int) -> None:
    need = fdlimit.needed(4096)
    assert need == 4096 * 3 + fdlimit.OWN_FILES
    assert fdlimit.plan(4096, soft=1024, hard=hard, unlimited=unlimited) == fdlimit.FdPlan(need, None)


def test_a_hard_limit_below_the_need_raises_what_it_can_and_says_so() -> None:
    chosen = fdlimit.plan(4096, soft=1024, hard=8192)
    assert chosen.raise_to == 8192
    assert chosen.warning is not None
    assert "4096 ranks" in chosen.warning and "hard limit is 8192" in chosen.warning and "HINT:" in chosen.warning
    assert fdlimit.plan(4096, soft=1024, hard=1024).raise_to is None

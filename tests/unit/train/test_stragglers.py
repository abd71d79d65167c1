"""Who is a straggler given a window of per-rank timings: slow rank, slow node, noisy but healthy, one spike."""

from __future__ import annotations

import random

import pytest

from torchslurm.train.stragglers import (
    DEFAULT_THRESHOLD,
    RankTiming,
    Straggler,
    find_stragglers,
    gather_record,
    needed_gathers,
    ratios,
    status_lines,
    summary,
)

STEPS = 50
NODES_4X4 = [f"node{r // 4}" for r in range(16)]


def gather(own: list[float], data: list[float] | None = None) -> list[RankTiming]:
    """One gather where rank r spent own[r] s per step not waiting for others; all ranks take the slowest's
    time per step, the rest of it waiting in the all-reduce."""
    step = max(own)
    data = data or [0.0] * len(own)
    return [RankTiming(STEPS, STEPS * step, STEPS * d, STEPS * (step - o)) for o, d in zip(own, data, strict=True)]


def test_one_slow_rank_is_named_with_its_node() -> None:
    own = [0.10] * 16
    own[5] = 0.16
    found = find_stragglers([gather(own)] * 5, NODES_4X4)
    assert [(s.ranks, s.node, s.whole_node) for s in found] == [((5,), "node1", False)]
    assert found[0].ratio == pytest.approx(1.6)
    assert found[0].describe(250) == "rank 5 on node1 1.6× the median compute time for the last 250 steps"


def test_a_slow_node_is_named_as_a_node() -> None:
    own = [0.10] * 16
    own[12:16] = [0.16, 0.161, 0.159, 0.16]
    found = find_stragglers([gather(own)] * 5, NODES_4X4)
    assert [(s.ranks, s.node, s.whole_node) for s in found] == [((12, 13, 14, 15), "node3", True)]
    assert summary(found, 200) == "node3 (ranks 12-15) 1.6× the median compute time for the last 200 steps"


def test_noisy_but_healthy_names_none() -> None:
    rng = random.Random(7)
    window = [gather([0.10 * rng.uniform(0.85, 1.15) for _ in range(16)]) for _ in range(5)]
    assert find_stragglers(window, NODES_4X4) == []


def test_one_spike_names_none_but_a_lasting_slowdown_is_named_after_more_than_half_the_window() -> None:
    healthy, spike = [0.10] * 8, [0.10] * 7 + [0.50]
    nodes = ["a"] * 4 + ["b"] * 4
    assert find_stragglers([gather(healthy), gather(healthy), gather(spike), gather(healthy), gather(healthy)],
                           nodes) == []
    window = [gather(healthy)] * 5
    named_after = None
    for n in range(1, 6):  # rank 7 slows down for good
        window = [*window[1:], gather(spike)]
        if find_stragglers(window, nodes):
            named_after = n
            break
    assert named_after == needed_gathers(5) == 3


def test_too_few_gathers_or_one_rank_decide_nothing() -> None:
    slow = gather([0.1, 0.1, 0.3])
    assert find_stragglers([slow, slow], ["a", "b", "c"]) == []
    assert find_stragglers([slow, slow, slow], ["a", "b", "c"]) != []
    assert find_stragglers([gather([0.3])] * 5, ["a"]) == []


def test_just_below_the_threshold_is_healthy() -> None:
    below, above = [0.1] * 4 + [0.1 * (DEFAULT_THRESHOLD - 0.02)], [0.1] * 4 + [0.1 * (DEFAULT_THRESHOLD + 0.02)]
    assert find_stragglers([gather(below)] * 3, list("abcde")) == []
    assert find_stragglers([gather(above)] * 3, list("abcde")) != []


def test_a_slow_data_loader_counts_and_is_said() -> None:
    own, data = [0.1] * 4, [0.01] * 4
    own[2], data[2] = 0.3, 0.2  # rank 2 waits 0.2 s per step for its batches
    found = find_stragglers([gather(own, data)] * 3, ["a", "a", "b", "b"])
    assert [s.ranks for s in found] == [(2,)]
    assert "mostly waiting for its data loader" in found[0].describe(150)


def test_ratios_are_against_the_median_of_the_others() -> None:
    assert ratios(gather([0.1, 0.2])) == pytest.approx([0.5, 2.0])
    assert ratios(gather([0.1, 0.1, 0.1, 0.4])) == pytest.approx([1.0, 1.0, 1.0, 4.0])
    assert ratios(gather([0.0, 0.0])) == [1.0, 1.0]


def test_mismatched_gathers_are_refused() -> None:
    with pytest.raises(ValueError, match="one timing per rank"):
        find_stragglers([gather([0.1, 0.1, 0.1])] * 3, ["a", "b"])


def test_the_record_and_status_lines() -> None:
    own = [0.1, 0.1, 0.1, 0.2]
    g = gather(own)
    named = [Straggler((3,), "b", 2.0, False)]
    record = gather_record(150, g, named, 150)
    assert (record["kind"], record["step"], record["slowest_rank"], record["stragglers"]) == ("steptime", 150, 3, 1)
    assert record["slowest_ratio"] == pytest.approx(2.0) and record["compute_s"] == pytest.approx(0.1)
    assert record["collective_s"] == pytest.approx(0.1)
    assert status_lines(record) == ["straggler: rank 3 on b 2.0× the median compute time for the last 150 steps "
                                    "(step 150)"]
    assert status_lines(gather_record(200, g, [], 150)) == ["stragglers: none (step 200)"]


def timing(own: float, data: float = 0.0, steps: int = 1) -> RankTiming:
    """A rank that spent `own` seconds a step not waiting for others (`data` of them on its loader)."""
    return RankTiming(steps, steps * (own + 1.0), steps * data, steps * 1.0)


@pytest.mark.parametrize(("own", "expected"), [
    ([4.0, 1.0, 2.0], [4.0 / 1.5, 1.0 / 3.0, 2.0 / 2.5]),  # two others: their mean; the slow rank first
    ([8.0, 1.0, 3.0, 2.0], [4.0, 1.0 / 3.0, 1.5, 2.0 / 3.0]),  # three others: the middle one
    ([3.0, 1.0, 2.0, 9.0, 4.0], [3.0 / 3.0, 1.0 / 3.5, 2.0 / 3.5, 9.0 / 2.5, 4.0 / 2.5]),
    ([1.0, 2.0, 3.0, 4.0, 5.0, 9.0], [1.0 / 4.0, 2.0 / 4.0, 3.0 / 4.0, 4.0 / 3.0, 5.0 / 3.0, 9.0 / 3.0]),
    ([5.0], [1.0]), ([0.0, 0.0], [1.0, 1.0]),  # no other rank, or others without own time
])
def test_each_rank_against_the_median_of_the_others_in_any_order(own: list[float], expected: list[float]) -> None:
    assert ratios([timing(o) for o in own]) == pytest.approx(expected)


def test_a_timing_of_no_steps_is_zero_per_step() -> None:
    assert RankTiming(0, 3.0, 1.0, 1.0).per_step(3.0) == 0.0
    assert RankTiming(1, 3.0, 1.0, 1.0).per_step(3.0) == 3.0
    assert RankTiming(4, 3.0, 1.0, 1.0).per_step(3.0) == 0.75


def test_exactly_at_the_threshold_is_slow_and_one_gather_can_be_enough() -> None:
    found = find_stragglers([[timing(2.0), timing(2.0), timing(3.0)]], ["n1", "n1", "n1"], threshold=1.5,
                            min_gathers=1)
    assert [(s.ranks, s.ratio) for s in found] == [((2,), 1.5)]
    assert find_stragglers([], ["n1", "n1"], min_gathers=0) == []


def test_the_slowest_is_named_first_and_each_by_itself_on_one_node() -> None:
    window = [[timing(1.0), timing(2.0), timing(1.0), timing(1.0), timing(3.0)]] * 3
    found = find_stragglers(window, ["n1"] * 5)
    assert [(s.ranks, s.ratio, s.whole_node) for s in found] == [((4,), 3.0, False), ((1,), 2.0, False)]
    assert summary(found, 10) == ("rank 4 on n1 3.0× the median compute time for the last 10 steps; "
                                  "rank 1 on n1 2.0× the median compute time for the last 10 steps")
    # every rank "slow" (a threshold of 1): one node is never a whole-node verdict
    alike = find_stragglers([[timing(1.0)] * 3] * 3, ["n1"] * 3, threshold=1.0)
    assert [(s.ranks, s.whole_node) for s in alike] == [((0,), False), ((1,), False), ((2,), False)]


def test_a_slow_node_of_two_among_two_nodes_is_the_node_a_lone_rank_node_is_its_rank() -> None:
    window = [[timing(1.0), timing(1.0), timing(2.0, data=1.2), timing(2.0, data=1.4)]] * 3
    (node,) = find_stragglers(window, ["a", "a", "b", "b"])
    assert (node.ranks, node.node, node.whole_node, node.ratio, node.data_share) == (
        (2, 3), "b", True, 2.0, pytest.approx(0.65))
    assert node.describe(7) == "b (ranks 2-3) 2.0× the median compute time, mostly waiting for its data loader for " \
                               "the last 7 steps"
    (alone,) = find_stragglers([[timing(1.0), timing(1.0), timing(2.0)]] * 3, ["a", "b", "c"])
    assert (alone.ranks, alone.whole_node) == ((2,), False)


def test_the_data_share_is_the_median_over_the_window_a_gather_without_own_time_counting_zero() -> None:
    idle = RankTiming(1, 1.0, 0.0, 1.0)  # all of its step waiting for the others
    fast = timing(0.25)  # under a second of own time a step, as fast steps are
    window = [[fast, fast, timing(0.5, data=0.1)], [fast, fast, timing(0.5, data=0.35)],
              [fast, fast, idle], [fast, fast, timing(0.5, data=0.15)]]
    (slow,) = find_stragglers(window, ["a", "a", "a"])
    assert slow.data_share == pytest.approx(0.25)  # median of 0.2, 0.7, 0.0, 0.3


def test_how_a_straggler_is_said_and_recorded() -> None:
    half = Straggler((3,), "n2", 1.23456, False, data_share=0.5)
    assert half.describe(9) == "rank 3 on n2 1.2× the median compute time for the last 9 steps"
    assert half.to_dict(9) == {"ranks": [3], "node": "n2", "ratio": 1.235, "whole_node": False,
                               "data_share": 0.5, "text": half.describe(9)}
    assert Straggler((4, 5, 6, 8, 10, 11), "n3", 2.0, True, 0.51234).to_dict(5) == {
        "ranks": [4, 5, 6, 8, 10, 11], "node": "n3", "ratio": 2.0, "whole_node": True, "data_share": 0.512,
        "text": "n3 (ranks 4-6,8,10-11) 2.0× the median compute time, mostly waiting for its data loader for the "
                "last 5 steps"}
    assert Straggler((7,), "n4", 1.5, True).describe(1) == (
        "n4 (rank 7) 1.5× the median compute time for the last 1 steps")
    assert Straggler((0, 2), "n5", 1.5, True).describe(1).startswith("n5 (ranks 0,2) 1.5×")


def test_the_record_of_a_gather_whole_and_of_none() -> None:
    record = gather_record(12, [timing(1.0, 0.2, steps=2), timing(3.0, 0.4, steps=2), timing(2.0, steps=2)], [], 4)
    assert record == {"kind": "steptime", "step": 12, "compute_s": pytest.approx(2.0), "collective_s": 1.0,
                      "data_s": pytest.approx(0.2), "slowest_rank": 1, "slowest_ratio": 2.0, "stragglers": 0,
                      "named": []}
    assert gather_record(3, [], [], 4) == {"kind": "steptime", "step": 3, "compute_s": 0.0, "collective_s": 0.0,
                                           "data_s": 0.0, "slowest_rank": 0, "slowest_ratio": 1.0, "stragglers": 0,
                                           "named": []}
    assert status_lines({}) == ["stragglers: none (step ?)"]

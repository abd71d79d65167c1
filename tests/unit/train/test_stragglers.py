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

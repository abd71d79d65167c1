"""Every rank's stacks, grouped: which ranks are where, the odd group named, mismatched collectives
called out. Pure: RankStack values in, text out (used by the hang report and `torchslurm stacks`).

    ranks 0-2: all_reduce at train.py:88 <- step at train.py:120
    rank 3:    DataLoader __next__ at train.py:115
    likely cause: rank 3 on node2 is not in a collective; ranks 0-2 wait for it in all_reduce.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from torchslurm.hostlist import compress
from torchslurm.runtime.stackdump import Frame, RankStack, ThreadStack, collective_of

CHAIN = 4
"""Calls shown per stack, innermost first (the full stacks go to a file)."""
WRAPPERS = ("wrapper", "decorate_context", "_wrapped_call_impl", "_call_impl", "inner", "_fn")
"""Functions that only wrap the call that matters (torch's decorators, nn.Module.__call__): skipped
when naming what a frame called."""


@dataclass(frozen=True)
class Group:
    """Ranks whose main threads stand at the same place."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    place: str
    """Where they are: `all_reduce at train.py:88 <- step at train.py:120`."""
    collective: str | None
    """The collective they wait in, if any."""
    site: str
    """The innermost step of `place`: `all_reduce at train.py:88`."""
    collectives: tuple[int | None, ...]
    """Each rank's count of issued collectives (same order as ranks)."""


def rank_ranges(ranks: Iterable[int]) -> str:
    """`rank 3` or `ranks 0-2, 4-7`."""
    ordered = sorted(set(ranks))
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    word = "rank" if len(ordered) == 1 else "ranks"
    return f"{word} {', '.join(parts)}" if ordered else "no rank"


def short_name(func: str) -> str:
    """A qualified name without its `<locals>` path: `Trainer._fit.<locals>.step` -> `step`."""
    return func.rsplit("<locals>.", 1)[-1]


def _callee(frames: Sequence[Frame], index: int) -> str:
    """What frames[index] called: the collective when one is below it, else the first frame below it
    that is not a mere wrapper; `in f` for the innermost frame's own function f (it runs, or waits in a
    C call: a lock, a sleep)."""
    below = list(frames[index + 1:])
    for depth, frame in enumerate(below):
        if frame.kind != "library":  # the next frame of the user's or torchslurm's: its callee ends here
            below = below[:max(depth, 1)]
            break
    collective = collective_of(below, distributed=False)
    if collective is not None:
        return collective
    for frame in below:
        if short_name(frame.func).rsplit(".", 1)[-1] not in WRAPPERS:
            return short_name(frame.func)
    return f"in {short_name(frames[index].func)}"


def _anchors(frames: Sequence[Frame], chain: int) -> list[int]:
    """Indices of the frames worth naming, innermost first: user and torchslurm frames (at most
    `chain`, the innermost user frame always among them), else the innermost frame."""
    named = [i for i, f in enumerate(frames) if f.kind in ("user", "own")][::-1]
    if not named:
        return [len(frames) - 1] if frames else []
    shown = named[:chain]
    users = [i for i in named if frames[i].kind == "user"]
    if users and users[0] not in shown:
        shown[-1] = users[0]
    return shown


def place(frames: Sequence[Frame], chain: int = CHAIN) -> tuple[str, str]:
    """(`what at file:line <- caller at file:line ...`, its first step: `what at file:line`)."""
    anchors = _anchors(frames, chain)
    if not anchors:
        return "no Python frames", "no Python frames"
    steps = [f"{_callee(frames, i)} at {frames[i].where}" for i in anchors]
    named = [i for i, f in enumerate(frames) if f.kind in ("user", "own")][::-1]
    if len(anchors) > 1 and anchors[-1] != named[len(anchors) - 1]:  # frames left out before the user's
        steps[-1] = "... <- " + steps[-1]
    return " <- ".join(steps), steps[0]


def _signature(thread: ThreadStack | None) -> tuple[tuple[str, int, str], ...]:
    """Identical stacks: the same frames; library frames by function only (their waiting loops sit on
    varying lines)."""
    if thread is None:
        return ()
    return tuple((f.file, f.line if f.kind != "library" else 0, f.func) for f in thread.frames)


def group_ranks(stacks: Mapping[int, RankStack], distributed: bool = True) -> list[Group]:
    """Ranks grouped by identical main-thread stacks, in order of their lowest rank."""
    by_signature: dict[tuple[tuple[str, int, str], ...], list[int]] = {}
    for rank in sorted(stacks):
        by_signature.setdefault(_signature(stacks[rank].main), []).append(rank)
    groups = []
    for ranks in by_signature.values():
        main = stacks[ranks[0]].main
        frames = main.frames if main is not None else ()
        text, site = place(frames)
        groups.append(Group(tuple(ranks), tuple(stacks[r].host for r in ranks), text,
                            collective_of(frames, distributed), site,
                            tuple(stacks[r].collectives for r in ranks)))
    return sorted(groups, key=lambda g: g.ranks[0])


def _hosts(group: Group) -> str:
    """The group's hosts as a Slurm hostlist (node[1-2,4])."""
    return compress(dict.fromkeys(group.hosts))


def likely_cause(groups: Sequence[Group]) -> str | None:
    """The odd group and why, or None when every rank stands at one place or no group stands out.

    A group outside any collective while others wait in one holds them up (the smallest such group);
    otherwise the smallest group, when it is the only one of its size."""
    if len(groups) < 2:
        return None
    outside = [g for g in groups if g.collective is None]
    waiting = [g for g in groups if g.collective is not None]
    if outside and waiting:
        odd = min(outside, key=lambda g: (len(g.ranks), g.ranks[0]))
        others = sorted(r for g in waiting for r in g.ranks)
        names = sorted({g.collective for g in waiting if g.collective})
        return (f"{rank_ranges(odd.ranks)} on {_hosts(odd)} {'is' if len(odd.ranks) == 1 else 'are'} not in a "
                f"collective ({odd.site}); {rank_ranges(others)} {'waits' if len(others) == 1 else 'wait'} for it in "
                f"{', '.join(names)}.")
    sizes = sorted(len(g.ranks) for g in groups)
    if sizes[0] == sizes[1]:
        return None
    odd = min(groups, key=lambda g: len(g.ranks))
    only = "the only rank" if len(odd.ranks) == 1 else "the only ranks"
    return f"{rank_ranges(odd.ranks)} on {_hosts(odd)}: {only} at {odd.site}."


def mismatches(groups: Sequence[Group]) -> list[str]:
    """Collectives the ranks disagree on: ranks waiting in collectives with different counts issued so
    far, or in different collectives (or call sites) at the same count; a rank outside any collective
    that has not issued all but the one the others wait in."""
    waiting = {rank: count for g in groups if g.collective is not None
               for rank, count in zip(g.ranks, g.collectives, strict=True) if count is not None}
    outside = {rank: count for g in groups if g.collective is None
               for rank, count in zip(g.ranks, g.collectives, strict=True) if count is not None}
    found = []
    by_count: dict[int, list[int]] = {}
    for rank, count in waiting.items():
        by_count.setdefault(count, []).append(rank)
    if len(by_count) > 1:
        parts = [f"{rank_ranges(ranks)} in their collective #{count}" for count, ranks in sorted(by_count.items())]
        found.append(f"the waiting ranks are at different collectives: {'; '.join(parts)} (a rank skipped a "
                     "collective, or made one the others did not).")
    elif len(by_count) == 1:
        (count, ranks), = by_count.items()
        behind = {rank: n for rank, n in outside.items() if n != count - 1}
        for rank, n in sorted(behind.items()):
            found.append(f"rank {rank} has issued {n} collectives and {rank_ranges(ranks)} wait in their #{count}: "
                         f"rank {rank} {'skipped' if n < count - 1 else 'made'} {abs(count - 1 - n)} "
                         f"{'more ' if n > count - 1 else ''}collective(s).")
        calls = [g for g in groups if g.collective is not None]
        if len(calls) > 1:
            parts = [f"{rank_ranges(g.ranks)} in {g.site}" for g in calls]
            found.append(f"the ranks wait in different collectives: {'; '.join(parts)}.")
    return found


def _other_threads(stacks: Mapping[int, RankStack]) -> list[str]:
    """Threads besides the main one that run user code (a lock holder, a worker thread)."""
    lines = []
    for rank in sorted(stacks):
        for thread in stacks[rank].threads:
            if not thread.main and any(f.kind == "user" for f in thread.frames):
                lines.append(f"  rank {rank} thread {thread.name!r}: {place(thread.frames)[0]}")
    return lines


def format_groups(stacks: Mapping[int, RankStack], world_size: int, distributed: bool = True) -> str:
    """The grouped report of `stacks` (the ranks that answered) out of `world_size` ranks."""
    groups = group_ranks(stacks, distributed)
    labels = [rank_ranges(g.ranks) + ":" for g in groups]
    width = max((len(label) for label in labels), default=0)
    lines = [f"  {label:<{width}} {g.place}" + (f"  [{_hosts(g)}]" if g.hosts else "")
             for label, g in zip(labels, groups, strict=True)]
    missing = sorted(set(range(world_size)) - set(stacks))
    if missing:
        lines.append(f"  {rank_ranges(missing)}: no answer (not running, or a C call holds the GIL)")
    cause = likely_cause(groups)
    if cause:
        lines.append(f"likely cause: {cause}")
    elif missing and stacks:
        lines.append(f"likely cause: {rank_ranges(missing)}, which did not answer.")
    lines += [f"mismatch: {text}" for text in mismatches(groups)]
    others = _other_threads(stacks)
    if others:
        lines += ["other threads running user code:", *others]
    return "\n".join(lines)

"""How a rank's report reaches `torchslurm doctor --ranks` through a pipe the ranks share.

A report travels as numbered parts, each line shorter than 1 KiB: srun forwards longer lines in
1 KiB chunks that interleave with other tasks' output. Parts are keyed by the sending process, not
its rank: misplaced ranks (the doctor's business) may share a rank. Each part line is
`PART_TAG sender index count piece`; the pieces joined are the report's JSON (`Report.to_json`).
Pure: the CLI writes the lines and reads them back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from torchslurm.doctor.facts import Report

PART_TAG = "@torchslurm-doctor-part"
"""What starts a part (after any prefix, such as srun's `--label`): other lines are passed through."""
PART_CHARS = 800
"""JSON characters per part: with the tag, sender and numbers, a line stays below srun's 1 KiB."""


def report_parts(result: Report, sender: str) -> list[str]:
    """The lines a rank prints: `tag sender index count piece` (sender: host:pid, no blanks; the
    JSON report is ASCII)."""
    text = json.dumps(result.to_json())
    pieces = [text[i:i + PART_CHARS] for i in range(0, len(text), PART_CHARS)]
    return [f"{PART_TAG} {sender} {i} {len(pieces)} {piece}\n" for i, piece in enumerate(pieces)]


def reports_from_parts(lines: Sequence[str]) -> tuple[list[Report], int]:
    """The inverse of `report_parts` over every process's lines, in any order (a prefix such as srun's
    `--label` is skipped): the reports sorted by rank, and how many senders' parts were incomplete
    or unreadable."""
    parts: dict[str, dict[int, str]] = {}
    counts: dict[str, int] = {}
    for line in lines:
        try:
            _, sender, index, count, piece = line[line.index(PART_TAG):].rstrip("\n").split(" ", 4)
            parts.setdefault(sender, {})[int(index)] = piece
            counts[sender] = int(count)
        except ValueError:
            continue  # a mangled line: its sender's report stays incomplete
    reports, unreadable = [], 0
    for sender, got in parts.items():
        try:
            reports.append(Report.from_json(json.loads("".join(got[i] for i in range(counts[sender])))))
        except (KeyError, ValueError, TypeError):
            unreadable += 1
    return sorted(reports, key=lambda r: (r.rank is None, r.rank or 0)), unreadable

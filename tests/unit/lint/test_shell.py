"""Words as bash reads them: quotes, comments, expansions lint can know, and per-task variables that
the batch shell expands once."""

from __future__ import annotations

from torchslurm.lint.shell import batch_expanded, batch_marker, expand, raw_words, shown


def _known(name: str, arithmetic: bool) -> str | None:
    return {"NODES": "2", "MSG": "a b", "SLURM_NNODES": "4"}.get(name)


def test_words_split_at_unquoted_blanks_and_stop_at_a_comment() -> None:
    assert raw_words("srun  'a b' \"c d\" e\\ f # not this") == ["srun", "'a b'", '"c d"', "e\\ f"]
    assert raw_words("x=$(echo a b) y") == ["x=$(echo a b)", "y"]


def test_quotes_go_and_known_variables_expand() -> None:
    assert expand("'$NODES'", _known) == ["$NODES"]
    assert expand('"$NODES"', _known) == ["2"]
    assert expand("$MSG", _known) == ["a", "b"]  # unquoted: split at blanks
    assert expand('"$MSG"', _known) == ["a b"]
    assert expand("$MSG", _known, split=False) == ["a b"]  # an assignment's value is not split
    assert expand("$((SLURM_NNODES * 2))", _known) == ["8"]


def test_a_per_task_variable_expanded_by_the_batch_shell_is_marked_and_shown_as_written() -> None:
    word = f"--rank={batch_marker('SLURM_PROCID')}"
    assert batch_expanded(word) == "SLURM_PROCID" and shown(word) == "--rank=$SLURM_PROCID"
    assert batch_expanded("--rank=$SLURM_PROCID") is None

"""Words as bash reads them: quotes, comments, expansions lint can know, and per-task variables that
the batch shell expands once."""

from __future__ import annotations

from torchslurm.lint.shell import MAX_VALUE, batch_expanded, batch_marker, expand, raw_words, shown


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


def test_pieces_nested_thousands_deep_are_scanned_without_recursion() -> None:
    nested = '"' + '$(echo "' * 3000 + "x" + '")' * 3000 + '"'
    assert raw_words(f"echo {nested} next") == ["echo", nested, "next"]
    assert raw_words("echo " + "${a:-" * 3000 + "x" + "}" * 3000) == ["echo", "${a:-" * 3000 + "x" + "}" * 3000]


def test_defaults_nested_past_the_limit_stay_as_written() -> None:
    deep = "${A:-" * 500 + "x" + "}" * 500
    assert expand(deep, _known) == [deep]
    assert expand("${A:-${B:-x}}", _known) == ["x"]


def test_a_word_whose_values_add_up_past_the_limit_stays_as_written() -> None:
    """`A=$A$A` over and over would otherwise double a value until memory runs out."""
    long = "y" * (MAX_VALUE // 2 + 1)
    assert expand("$L$L", lambda name, _: long if name == "L" else None) == ["$L$L"]
    assert expand("$L", lambda name, _: long if name == "L" else None) == [long]

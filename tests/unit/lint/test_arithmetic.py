"""`$(( ))` as bash evaluates it: precedence, truncating division, 64-bit wrap-around, and any depth of
parentheses without recursion."""

from __future__ import annotations

import pytest

from torchslurm.lint.arithmetic import evaluate


@pytest.mark.parametrize(("text", "value"), [
    ("1 + 2 * 3", "7"), ("(1 + 2) * 3", "9"), ("7 / 2", "3"), ("-7 / 2", "-3"), ("-7 % 3", "-1"), ("7 % -3", "1"),
    ("- - 4", "4"), ("+4", "4"), ("2 * -3", "-6"), ("10 - 2 - 3", "5"), ("(((8)))", "8"),
    ("3037000500 * 3037000500", "-9223372036709301616"),  # bash's intmax_t wraps around
])
def test_arithmetic_as_bash_does_it(text: str, value: str) -> None:
    assert evaluate(text) == value


@pytest.mark.parametrize("text", ["", "1 2", "(1", "1)", "()", "1 +", "* 2", "4 / 0", "4 % (1 - 1)", "9" * 19])
def test_what_bash_would_refuse_or_lint_cannot_know_is_none(text: str) -> None:
    assert evaluate(text) is None


def test_parentheses_thousands_deep_are_evaluated_without_recursion() -> None:
    """bash -n accepts `$((` with hundreds of parentheses; a recursive descent parser hit Python's recursion limit."""
    assert evaluate("(" * 5000 + "6 * 7" + ")" * 5000) == "42"
    assert evaluate("-(" * 3000 + "1" + ")" * 3000) == "1"


def test_a_product_of_many_factors_stays_a_64_bit_integer() -> None:
    value = evaluate(" * ".join(["99999999999"] * 5000))
    assert value is not None and -(2 ** 63) <= int(value) < 2 ** 63

"""`$(( ... ))` evaluated as bash does, for lint to know what a count or rank works out to: whole numbers,
+ - * / % and parentheses, 64-bit signed integers that wrap, division truncating toward zero. Pure, part of
`lint`; names are substituted by shell.py first.

Iterative (operator precedence with two stacks), so that parentheses nested any depth deep, which bash
accepts, cost no recursion; anything else bash would refuse or lint cannot know gives None."""

from __future__ import annotations

import re

_TOKEN = re.compile(r"[0-9]+|[-+*/%()]")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "%": 2, "neg": 3, "pos": 3}
_BITS = 64


def _wrap(value: int) -> int:
    """bash's intmax_t: a result past 64 bits wraps around, as in C."""
    return (value + (1 << (_BITS - 1))) % (1 << _BITS) - (1 << (_BITS - 1))


def _apply(op: str, values: list[int]) -> None:
    if op in ("neg", "pos"):
        values.append(_wrap(-values.pop()) if op == "neg" else values.pop())
        return
    right, left = values.pop(), values.pop()
    if op in "/%":
        quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right > 0) else -1)  # toward zero
        values.append(_wrap(quotient if op == "/" else left - quotient * right))
    else:
        values.append(_wrap(left + right if op == "+" else left - right if op == "-" else left * right))


def evaluate(text: str) -> str | None:
    """The value of an arithmetic expression of whole numbers (`(2 * 4) / 3`), or None when it is not one
    (unbalanced parentheses, two numbers in a row, a division by zero, a number of more than 18 digits)."""
    values: list[int] = []
    ops: list[str] = []
    operand = True  # an operand (a number, `(` or a sign) comes next
    try:
        for token in _TOKEN.findall(text):
            if operand and token[0].isdigit():
                if len(token) > 18:
                    return None
                values.append(int(token))
                operand = False
            elif operand and token in "+-(":
                ops.append("(" if token == "(" else "neg" if token == "-" else "pos")
            elif operand:
                return None
            elif token == ")":
                while ops and ops[-1] != "(":
                    _apply(ops.pop(), values)
                if not ops:
                    return None
                ops.pop()
            elif token in _PRECEDENCE:
                while ops and ops[-1] != "(" and _PRECEDENCE[ops[-1]] >= _PRECEDENCE[token]:
                    _apply(ops.pop(), values)
                ops.append(token)
                operand = True
            else:
                return None
        if operand or "(" in ops:
            return None
        while ops:
            _apply(ops.pop(), values)
    except ZeroDivisionError:
        return None
    return str(values[0]) if len(values) == 1 else None

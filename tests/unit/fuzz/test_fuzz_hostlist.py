"""Hostlists of any text: expanded, compressed and counted, or refused with a HINT; never a traceback."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tests.unit.fuzz.conftest import FUZZ, answered

from torchslurm.hostlist import MAX_HOSTS, compress, expand, expand_counts

HOSTLISTY = st.text(alphabet="gpun0123456789[]-,()x ٣²\n", max_size=60) | st.text(max_size=30)


@FUZZ
@given(HOSTLISTY)
def test_any_expression_expands_or_is_refused(expression: str) -> None:
    hosts = answered(lambda: expand(expression))
    if hosts is not None:
        assert len(hosts) <= MAX_HOSTS
        again = answered(lambda: expand(compress(hosts)))  # what compress writes, expand reads back
        assert again == hosts or not hosts


@FUZZ
@given(st.lists(HOSTLISTY, max_size=8))
def test_any_names_compress_or_are_refused(hosts: list[str]) -> None:
    answered(lambda: compress(hosts))


@FUZZ
@given(st.text(alphabet="0123456789(x),٣ ", max_size=40) | st.text(max_size=20))
def test_any_counts_expand_or_are_refused(value: str) -> None:
    counts = answered(lambda: expand_counts(value))
    assert counts is None or len(counts) <= MAX_HOSTS

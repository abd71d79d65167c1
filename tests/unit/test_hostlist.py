"""torchslurm.hostlist: pure cases, properties, and a comparison with the real `scontrol`.

The comparison tests run whenever Slurm's client is installed (CI installs it): scontrol needs
only a minimal slurm.conf, no daemon. Each expected value below was first observed with
`scontrol show hostnames` / `scontrol show hostlist` of slurm-wlm 22.05.8.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchslurm.errors import ConfigError, HostlistError
from torchslurm.hostlist import MAX_RANGE, compress, expand, expand_counts


@pytest.mark.parametrize(
    ("expression", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[1,3-5]", ["n1", "n3", "n4", "n5"]),
        ("n1, n2", ["n1", "n2"]),
        ("n1\tn2\nn3 n4", ["n1", "n2", "n3", "n4"]),
        (",n1,,n2,", ["n1", "n2"]),
        ("", []),
        ("1.2.3.[100-102]", ["1.2.3.100", "1.2.3.101", "1.2.3.102"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("n1,n1,n[1-2]", ["n1", "n1", "n1", "n2"]),
        ("n[01-1]", ["n01"]),  # width comes from the low end
        ("n[8-011]", ["n8", "n9", "n10", "n11"]),
        ("n[1-02]", ["n1", "n2"]),
        ("n[01,1]", ["n01", "n1"]),
        ("[1-3]", ["1", "2", "3"]),
        ("n[1-2]-[3]", ["n1-3", "n2-3"]),
        ("n#[1-2]", ["n#1", "n#2"]),
        ("gpu[9-10],login", ["gpu9", "gpu10", "login"]),
        # Slurm's order for three groups: the middle group loops outermost, the last fastest.
        ("n[1-2]a[3-4]b[5-6]",
         ["n1a3b5", "n1a3b6", "n2a3b5", "n2a3b6", "n1a4b5", "n1a4b6", "n2a4b5", "n2a4b6"]),
    ],
)
def test_expand_matches_slurm(expression: str, hosts: list[str]) -> None:
    assert expand(expression) == hosts


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("n[010-8]", "range '010-8' runs backwards (10 > 8)"),
        ("n[3-1]", "range '3-1' runs backwards"),
        ("n[a-c]", "range 'a-c' in [a-c] is not `N` or `LO-HI`"),
        ("n[]", "range '' in [] is not"),
        ("n[1,]", "range '' in [1,] is not"),
        ("n[-3]", "range '-3' in [-3] is not"),
        ("n[1--3]", "range '1--3'"),
        ("n[1-3-5]", "range '1-3-5'"),
        ("n[1-3]x", "'x' follows the last ']' in 'n[1-3]x'"),
        ("a[1-2]b[3-4]c", "'c' follows the last ']'"),
        ("n[1-3]]", "']' without '[' at position 6"),
        ("n[[1-2]]", "nested '[' at position 2"),
        (f"n[1-{MAX_RANGE + 1}]", f"holds {MAX_RANGE + 1} numbers, Slurm allows {MAX_RANGE}"),
        ("n[0-99999999999]", "holds 100000000000 numbers"),
        # Slurm turns these into nonsense names instead of an error; we refuse them.
        ("n[1-3", "'[' is never closed"),
        ("n1]", "']' without '['"),
        ("n[ 1-3]", "whitespace inside brackets at position 2"),
        ("n[1-]", "range '1-' in [1-] is not"),
        ("n[+1-2]", "range '+1-2'"),
        ("n[99999999999999999999]", "is larger than"),
    ],
)
def test_expand_rejects_with_expression_and_hint(expression: str, message: str) -> None:
    with pytest.raises(HostlistError, match="HINT:") as caught:
        expand(expression)
    assert repr(expression) in caught.value.message and message in caught.value.message
    assert caught.value.hint and "HINT:" not in caught.value.message
    assert isinstance(caught.value, ConfigError)


@pytest.mark.parametrize(("call", "message", "hint"), [
    (lambda: expand("n[[1-2]]"), "invalid hostlist 'n[[1-2]]': nested '[' at position 2.",
     "brackets cannot be nested."),
    (lambda: expand("n1]"), "invalid hostlist 'n1]': ']' without '[' at position 2.", "balance the brackets."),
    (lambda: expand("n[ 1-3]"), "invalid hostlist 'n[ 1-3]': whitespace inside brackets at position 2.",
     "write ranges without spaces, e.g. n[1,3-5]."),
    (lambda: expand("n[1-3"), "invalid hostlist 'n[1-3': '[' is never closed.", "close every '[' with ']'."),
    (lambda: expand("n1,n[1-3]x"), "invalid hostlist 'n1,n[1-3]x': 'x' follows the last ']' in 'n[1-3]x'.",
     "Slurm cannot bracket a suffix: list the full names, e.g. 'n1x,n2x,n3x'."),
    (lambda: expand("n[a-c]"), "invalid hostlist 'n[a-c]': range 'a-c' in [a-c] is not `N` or `LO-HI` with digits "
     "only.", "use ranges like [1-4] or [01-08,12]."),
    (lambda: expand("n[010-8]"), "invalid hostlist 'n[010-8]': range '010-8' runs backwards (10 > 8).",
     "write it as [8-010] or list the numbers."),
    (lambda: expand(f"n[{2**64 - 1}]"), f"invalid hostlist 'n[{2**64 - 1}]': number {2**64 - 1} in '{2**64 - 1}' is "
     f"larger than {2**64 - 2}.", "check the range for a typo."),
    (lambda: expand(f"n[1-{MAX_RANGE + 1}]"), f"invalid hostlist 'n[1-{MAX_RANGE + 1}]': range '1-{MAX_RANGE + 1}' "
     f"holds {MAX_RANGE + 1} numbers, Slurm allows {MAX_RANGE}.", "split the range or check it for a typo."),
    (lambda: expand("n[1-10],m[1-11]", max_hosts=20), "hostlist 'n[1-10],m[1-11]' expands to 21 hosts, more than "
     "the limit of 20.", "check the ranges for a typo (an extra digit), or pass a larger max_hosts."),
    (lambda: compress(["n1", "a b"]), "host name 'a b' cannot be written in a hostlist: it is empty or holds a "
     "separator (comma, space, tab, newline) or a bracket.", "pass plain host names such as 'node01'."),
    (lambda: expand_counts("2x3"), "count list '2x3': element '2x3' is not `N` or `N(xK)`.",
     "pass the value of SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE unchanged, e.g. '2(x3),1'."),
    (lambda: expand_counts("2(x0)"), "count list '2(x0)': repeat in '2(x0)' must be between 1 and 65536 nodes in "
     "all.", "pass the value Slurm set, e.g. '2(x3),1'."),
])
def test_each_refusal_says_what_and_how_to_fix_it(call: Callable[[], object], message: str, hint: str) -> None:
    """The whole text of every kind of refusal: the expression, the problem, and the hint's fix."""
    with pytest.raises(HostlistError) as caught:
        call()
    assert (caught.value.message, caught.value.hint) == (message, hint)


def test_the_largest_number_and_range_slurm_takes_are_taken() -> None:
    assert expand(f"n[{2**64 - 2}]") == [f"n{2**64 - 2}"]  # one below where Slurm's arithmetic breaks
    hosts = expand(f"n[1-{MAX_RANGE}]")
    assert (len(hosts), hosts[-1]) == (MAX_RANGE, f"n{MAX_RANGE}")
    assert expand_counts("2(x3),1", max_total=4) == [2, 2, 2, 1]  # exactly max_total nodes
    with pytest.raises(HostlistError, match="must be between 1 and 3 nodes in all"):
        expand_counts("2(x3),1", max_total=3)


def test_upper_case_names_compress() -> None:
    assert compress(["XL1", "XL2", "GPU-X"]) == "XL[1-2],GPU-X"
    assert expand("XL[1-2],GPU-X") == ["XL1", "XL2", "GPU-X"]


def test_expand_refuses_more_than_max_hosts() -> None:
    with pytest.raises(HostlistError, match=r"expands to 90000 hosts, more than the limit of 65536"):
        expand("a[1-300]b[1-300]")
    assert len(expand("n[1-10],m[1-10]", max_hosts=20)) == 20
    with pytest.raises(HostlistError, match="expands to 21 hosts"):
        expand("n[1-10],m[1-11]", max_hosts=20)


@pytest.mark.parametrize(
    ("hosts", "expression"),
    [
        (["n9", "n10", "n11", "m1", "n08", "n09"], "n[9-11],m1,n[08-09]"),
        (["n1", "n01", "n2", "n02"], "n[1,01,2,02]"),
        (["n5", "n6", "n1", "n2", "n7"], "n[5-6,1-2,7]"),
        (["n1", "n1", "n2"], "n[1,1-2]"),
        (["n1", "m1", "n2"], "n1,m1,n2"),
        (["n099", "n100"], "n[099-100]"),
        (["n08", "n9"], "n[08,9]"),
        (["1.2.3.100", "1.2.3.101"], "1.2.3.[100-101]"),
        (["a", "b", "n1"], "a,b,n1"),
        (["1", "2", "3"], "[1-3]"),
        ([], ""),
    ],
)
def test_compress_matches_slurm(hosts: list[str], expression: str) -> None:
    assert compress(hosts) == expression
    assert expand(expression) == hosts


@pytest.mark.parametrize("bad", ["", "a,b", "n 1", "n[1]", "n]"])
def test_compress_rejects_unwritable_names(bad: str) -> None:
    with pytest.raises(HostlistError, match=re.escape(f"host name {bad!r} cannot be written") + ".*HINT:"):
        compress(["n1", bad])


_NAME = st.text(alphabet="abnx.-_0123456789", min_size=1, max_size=8).filter(lambda s: not s.startswith("-"))


@given(st.lists(_NAME, max_size=30))
def test_compress_round_trips_in_order(hosts: list[str]) -> None:
    assert expand(compress(hosts)) == hosts


@pytest.mark.parametrize(
    ("value", "counts"),
    [("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1,2,3", [1, 2, 3]), ("8(x2)", [8, 8]), ("0", [0])],
)
def test_expand_counts(value: str, counts: list[int]) -> None:
    assert expand_counts(value) == counts


@pytest.mark.parametrize("value", ["", "2(x0)", "a", "2(x3", "2x3", "-1", "1,,2", "2(3)"])
def test_expand_counts_rejects(value: str) -> None:
    with pytest.raises(HostlistError, match=re.escape(f"count list {value!r}") + ".*HINT:"):
        expand_counts(value)


def test_expand_counts_refuses_huge_repeat() -> None:
    with pytest.raises(HostlistError, match="must be between 1 and 65536"):
        expand_counts("1(x100000000)")


# --- comparison with the real scontrol ------------------------------------------------------

SCONTROL = shutil.which("scontrol")
needs_scontrol = pytest.mark.skipif(SCONTROL is None, reason="Slurm's client (scontrol) is not installed")


@pytest.fixture(scope="module")
def scontrol_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=hostlisttest\nSlurmctldHost=localhost\nNodeName=n1\n")
    return {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}


def _scontrol(env: dict[str, str], what: str, expression: str) -> subprocess.CompletedProcess[str]:
    assert SCONTROL is not None
    result = subprocess.run([SCONTROL, "show", what, "--", expression], env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert "fatal" not in result.stderr, result.stderr
    return result


def _random_group(rng: random.Random) -> str:
    items = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        low = rng.choice([0, 1, 7, 8, 9, 10, 98, 99, 100, 999, rng.randrange(10_000)])
        low_text = f"{low:0{rng.choice([1, 1, 2, 3, 5])}d}"
        if rng.random() < 0.3:
            items.append(low_text)
            continue
        high = low + rng.randrange(5)
        items.append(f"{low_text}-{high:0{rng.choice([1, 2, 3])}d}")
    return "[" + ",".join(items) + "]"


def _random_token(rng: random.Random) -> str:
    literal_chars = "abgnpuxRS0123456789.-_"
    parts = [rng.choice("abnrgx12") + "".join(rng.choices(literal_chars, k=rng.randrange(5)))]
    if rng.random() < 0.2:
        parts = [""]  # `[1-3]`: an empty prefix is valid
    for index in range(rng.choice([0, 1, 1, 1, 2, 2, 3])):
        if index:
            parts.append("".join(rng.choices(literal_chars, k=rng.randrange(1, 3))))
        parts.append(_random_group(rng))
    token = "".join(parts)
    return token or "n0"


def _random_expression(rng: random.Random) -> str:
    tokens = [_random_token(rng) for _ in range(rng.choice([1, 1, 2, 3]))]
    return "".join(token + rng.choice([",", ", ", " ", ",,"]) for token in tokens).rstrip(", ")


@needs_scontrol
def test_expand_equals_scontrol_on_600_random_expressions(scontrol_env: dict[str, str]) -> None:
    rng = random.Random(20221)
    expressions = [_random_expression(rng) for _ in range(600)]
    # One scontrol call: expressions joined with marker hosts, output split at the markers.
    joined = ",".join(f"{expression},zzmark{index}" for index, expression in enumerate(expressions))
    result = _scontrol(scontrol_env, "hostnames", joined)
    assert result.returncode == 0 and not result.stderr, result.stderr
    slurm: list[list[str]] = [[]]
    for host in result.stdout.split():
        if host.startswith("zzmark"):
            slurm.append([])
        else:
            slurm[-1].append(host)
    assert len(slurm) == len(expressions) + 1
    mismatches = [(e, expand(e), s) for e, s in zip(expressions, slurm, strict=False) if expand(e) != s]
    assert mismatches == []
    assert sum(len(hosts) for hosts in slurm) > 2000  # the generator really produces ranges


def _invalid_expressions(rng: random.Random) -> list[str]:
    bad_tokens = ["n[3-1]", "n[010-8]", "n[a-c]", "n[]", "n[1,]", "n[,1]", "n[-3]", "n[1--3]", "n[1-3-5]",
                  "n[0x1-2]", "n[1-2x]", "n[1-3]x", "x[1-2]y", "a[1-2]b[3-4]c", "n[1-2]:5", "n[1-2](x2)",
                  "n[1-3]]", "n[[1-2]]", "n[1[2]]", "n[1-2]]x[3]", f"n[1-{MAX_RANGE + 1}]", "[]", "n[1,3 ]",
                  "n[0-99999999999]", "n[1-2]-a", "n[1-,3-]x"]
    expressions = list(bad_tokens)
    for bad in bad_tokens:
        expressions.append(f"{_random_token(rng)},{bad}")
        expressions.append(f"{bad}, {_random_token(rng)}")
    return expressions


@needs_scontrol
def test_expand_rejects_what_scontrol_rejects(scontrol_env: dict[str, str]) -> None:
    expressions = _invalid_expressions(random.Random(7))
    assert len(expressions) >= 70
    for expression in expressions:
        result = _scontrol(scontrol_env, "hostnames", expression)
        assert "Invalid hostlist" in result.stderr and result.stdout == "", expression
        with pytest.raises(HostlistError, match="HINT:"):
            expand(expression)


@needs_scontrol
@pytest.mark.parametrize(
    ("expression", "slurm_output"),
    [("n[1-3", "n]"), ("n1]", "n1]"), ("n[ 1-3]", "n01 n02 n03"), ("n[1-]", "n1"), ("n[+1-2]", "n01 n02")],
)
def test_scontrol_garbage_that_we_refuse(
    scontrol_env: dict[str, str], expression: str, slurm_output: str
) -> None:
    """Documents the deliberate deviations: Slurm accepts these and prints nonsense names."""
    assert _scontrol(scontrol_env, "hostnames", expression).stdout.split() == slurm_output.split()
    with pytest.raises(HostlistError):
        expand(expression)


@needs_scontrol
def test_compress_equals_scontrol_hostlist(scontrol_env: dict[str, str]) -> None:
    rng = random.Random(99)
    for _ in range(150):
        hosts = expand(_random_expression(rng))
        if rng.random() < 0.3:
            rng.shuffle(hosts)
        result = _scontrol(scontrol_env, "hostlist", ",".join(hosts))
        assert compress(hosts) == result.stdout.strip(), hosts
        assert expand(compress(hosts)) == hosts


def test_no_torch_needed(tmp_path: Path) -> None:
    """hostlist must work on a login node without torch."""
    script = ("import sys; sys.modules['torch'] = None; "
              "from torchslurm.hostlist import expand; print(expand('n[1-2]'))")
    src = str(Path(__file__).parents[2] / "src")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=False, cwd=tmp_path, env={"PYTHONPATH": src})
    assert result.stdout.strip() == "['n1', 'n2']", result.stderr


@pytest.mark.parametrize(("expression", "names"), [
    ("oss[1,2].local", "'oss1.local,oss2.local'."),
    ("gpu[1-2]-[3-4].ib", "'gpu1-3.ib,gpu1-4.ib,gpu2-3.ib,gpu2-4.ib'."),
    ("n[1-9]x", "'n1x,n2x,n3x,n4x' and the 5 others."),
    ("a[1-60000]b[1-60000]c", "'a1b1c,a1b2c,a1b3c,a1b4c' and the 3599999996 others."),
])
def test_suffix_hint_lists_full_names_keeping_the_domain(expression: str, names: str) -> None:
    """Slurm cannot bracket a suffix: the hint lists full names rather than dropping the domain."""
    with pytest.raises(HostlistError) as caught:
        expand(expression)
    assert caught.value.hint == f"Slurm cannot bracket a suffix: list the full names, e.g. {names}"


@pytest.mark.parametrize("expression", ["oss[1,2].local", "n[3-1]", "n[1-3]x", "n[ 1-3]", "n[a]x", "n[1-3"])
def test_every_example_in_a_hint_is_itself_valid(expression: str) -> None:
    with pytest.raises(HostlistError) as caught:
        expand(expression)
    examples = re.findall(r"e\.g\. '([^']*)'", caught.value.hint or "")
    for example in examples:
        assert expand(example)


@pytest.mark.parametrize("call", [lambda: expand("node[١-٢]"), lambda: expand("gpu[٣]"),
                                  lambda: expand_counts("٢(x3)"), lambda: expand_counts("2(x٣)")])
def test_other_scripts_digits_are_not_slurm_numbers(call: object) -> None:
    """`\\d` takes `٣`, and int() reads it as 3: a hostlist Slurm never wrote would name real nodes."""
    with pytest.raises(HostlistError, match="HINT"):
        call()  # type: ignore[operator]

"""Hostile names, paths and arguments are data, never code: a property test over random specs.

Each rendered script is checked three ways: `bash -n`; every `#SBATCH` line read back with
sbatch's own tokenizer gives exactly the value we meant; and a dry execution (srun and scontrol
replaced by shell functions that write their argv NUL-separated) shows each argument and
environment value arriving byte for byte, while nothing inside them ran (no canary file).
Values that cannot be written safely (newlines, NUL, lone surrogates, `/` in a job name) must be rejected with a
ConfigError instead.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from torchslurm.errors import ConfigError
from torchslurm.jobs.sbatch import directives, render, sbatch_split
from torchslurm.jobs.spec import JobSpec
from torchslurm.runtime.launch import AGENT_MODULE

NASTY = ["a", "b", " ", "  ", "'", '"', "$(touch pwned)", "`touch pwned`", "; touch pwned", "&& touch pwned",
         "|", "\\", "#", "*", "~", "$HOME", "${PATH}", "%x", "\t", "\v", "\x1e", "é", "{a,b}", ">pwned", "!", "-",
         "--x=1", "/"]
LINE_BREAKS = ["\n", "\r", "\0"]
# line breaks are rare (1 value in 40), so most specs get rendered; the ones that carry one must be rejected
good = st.one_of(st.lists(st.sampled_from(NASTY), min_size=1, max_size=6).map("".join),
                 st.text(alphabet=st.characters(blacklist_characters="\n\r\0"), min_size=1, max_size=12))
text = st.integers(0, 39).flatmap(lambda i: st.sampled_from(["x\ny", "a\rb", "\0", "ok\n"]) if i == 0 else good)

FAKES = r"""
srun() { printf '%s\0' "$@" > "$ARGV_OUT"; for k in $ENV_KEYS; do printf '%s\0' "${!k}"; done > "$ENV_OUT"; }
scontrol() { echo node1; echo node2; }
od() { echo " 0f 1e 2d 3c 4b 5a 69 78 87 96 a5 b4 c3 d2 e1 f0"; }  # the job's secret, fixed here
export -f srun scontrol od
"""
SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


@st.composite
def specs(draw: st.DrawFn) -> JobSpec:
    launch = draw(st.sampled_from(["srun", "torchrun"]))
    kwargs = dict(
        script=draw(text), args=tuple(draw(st.lists(text, max_size=4))), name=draw(text), launch=launch,
        python=draw(text), output=draw(text), partition=draw(st.none() | text), account=draw(st.none() | text),
        constraint=draw(st.none() | text), env=draw(st.dictionaries(st.sampled_from(["A", "B_2", "NCCL_X"]), text,
                                                                   max_size=2)),
        nic=draw(st.none() | text), per_rank_output=draw(st.booleans()), preemptible=draw(st.booleans()),
        signal=draw(st.sampled_from(["USR1", "USR2", "TERM"])), time="60", cpus_per_task=2,
    )
    if launch == "torchrun":
        kwargs["nproc_per_node"] = 2
    try:
        return JobSpec(**kwargs)  # type: ignore[arg-type]
    except ConfigError as exc:
        bad = [v for v in _values(kwargs) if any(c in v for c in "\n\r\0") or not _utf8(v)]
        words = _words(str(kwargs["python"]))  # None: a quote left open
        no_program = words is None or (str(kwargs["python"]).strip() != "" and not (words and words[0]))
        leading_dash = str(kwargs["script"]).startswith("-") or bool(words and words[0].startswith("-"))
        assert bad or no_program or leading_dash or "/" in str(kwargs["name"]) or "is empty" in str(exc), \
            f"rejected: {exc}"
        assert "HINT:" in str(exc)
        raise _Rejected from exc


class _Rejected(Exception):
    pass


def _utf8(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:  # lone surrogates, as os.fsdecode makes of undecodable file names
        return False
    return True


def _values(kwargs: dict[str, object]) -> list[str]:
    out: list[str] = []
    for value in kwargs.values():
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, tuple):
            out += [str(v) for v in value]
        elif isinstance(value, dict):
            out += [str(v) for v in value.values()]
    return out


def _words(command: str) -> list[str] | None:
    try:
        return shlex.split(command)
    except ValueError:
        return None


def expected_argv(spec: JobSpec) -> list[str]:
    argv = ["--quiet", "--kill-on-bad-exit=1"]
    if spec.per_rank_output:
        stem = spec.output[:-4] if spec.output.endswith(".out") else spec.output
        argv.append(f"--output={stem}-rank%t.out")
    elif spec.launch == "srun":
        argv.append("--label")
    if spec.launch == "srun":
        if spec.preemptible and spec.signal != "TERM":
            argv += ["bash", "-c", f'trap "" {spec.signal}; exec "$@"', "torchslurm-rank"]
        return [*argv, *shlex.split(spec.python), spec.script, *spec.args]
    argv += ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    if spec.preemptible and spec.signal != "TERM":
        argv += ["bash", "-c", f'trap "" {spec.signal}; exec "$@"', "torchrun-agent"]
    port = 10000 + int(SECRET[:8], 16) % 22768
    return [*argv, *shlex.split(spec.python), "-m", AGENT_MODULE, "--nproc-per-node=2", "--rdzv-backend=c10d",
            "--nnodes=2", f"--rdzv-endpoint=node1:{port}", "--rdzv-id=42", spec.script, *spec.args]


def dry_run(script: str, spec: JobSpec, workdir: Path) -> tuple[list[str], list[str]]:
    path = workdir / "job.sbatch"
    path.write_text(script)
    env_keys = sorted({**spec.env, **({"NCCL_SOCKET_IFNAME": ""} if spec.nic else {})})
    environ = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "42", "SLURM_NNODES": "2",
               "SLURM_JOB_NODELIST": "node[1-2]", "ARGV_OUT": str(workdir / "argv"),
               "ENV_OUT": str(workdir / "env"), "ENV_KEYS": " ".join(env_keys)}
    result = subprocess.run(["bash", "-c", FAKES + 'bash "$1"', "dry", str(path)], cwd=workdir, env=environ,
                            capture_output=True, timeout=30)
    assert result.returncode == 0, result.stderr
    argv = (workdir / "argv").read_bytes().decode().split("\0")[:-1]
    envs = (workdir / "env").read_bytes().decode().split("\0")[:-1]
    return argv, envs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_specs_stay_data(data: st.DataObject) -> None:
    try:
        spec = data.draw(specs())
    except _Rejected:
        event("rejected with a ConfigError")
        return
    event(f"rendered ({spec.launch})")
    script = render(spec)
    syntax = subprocess.run(["bash", "-n"], input=script.encode(), capture_output=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr

    header = [line[len("#SBATCH"):] for line in script.split("\n") if line.startswith("#SBATCH")]
    meant = [f"--{k}" if v is None else f"--{k}={v}" for k, v in sorted(directives(spec).items())]
    assert [sbatch_split(line) for line in header] == [[m] for m in meant]

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        argv, envs = dry_run(script, spec, workdir)
        assert argv == expected_argv(spec)
        want_env = {**spec.env, **({"NCCL_SOCKET_IFNAME": spec.nic} if spec.nic else {})}
        assert envs == [want_env[k] for k in sorted(want_env)]
        assert sorted(p.name for p in workdir.iterdir()) == ["argv", "env", "job.sbatch"]


@pytest.mark.parametrize("field", ["name", "script", "python", "output", "partition"])
@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b"])
def test_line_breaks_rejected_everywhere(field: str, bad: str) -> None:
    kwargs = {"script": "t.py", field: bad}
    with pytest.raises(ConfigError, match=rf"{field}=.* contains .*HINT: remove the line break"):
        JobSpec(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["script", "python"])
def test_option_lookalike_paths_rejected(field: str) -> None:
    kwargs = {"script": "t.py", field: "-c"}
    with pytest.raises(ConfigError, match=rf"{field}='-c' starts with '-'.*HINT: write it as a path: {field}: ./-c"):
        JobSpec(**kwargs)  # type: ignore[arg-type]


def test_newline_in_argument_rejected() -> None:
    with pytest.raises(ConfigError, match=r"args='x\\ny' contains '\\n'"):
        JobSpec(script="t.py", args=("ok", "x\ny"))

"""What Slurm's commands print, and the values a user types for Slurm, of any text: parsed or refused with a
HINT, never a traceback. Mutations of recorded output (fields cut, doubled, replaced) find the edges."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from tests.unit.fuzz.conftest import FUZZ, answered

from torchslurm.cli.cancel import check_signal
from torchslurm.doctor.bench import parse_sizes
from torchslurm.jobs.slurmoutput import (
    check_job_id,
    end_time_from_scontrol,
    gpus_of_gres,
    parse_job_id,
    parse_scontrol,
    parse_sinfo_nodes,
    parse_squeue,
    status_from_scontrol,
)
from torchslurm.jobs.slurmvalues import parse_slurm_version, parse_time
from torchslurm.runtime.distenv import detect
from torchslurm.runtime.variables import whole_number

RECORDED = Path(__file__).parents[2] / "fixtures" / "slurm_output"
WORDS = ["\t", " ", "\n", "=", ":", "(", ")", "[", "]", "-", ",", "_", "+", "%", "x", "N/A", "(null)", "RUNNING",
         "PENDING", "gpu:4", "gpu:a100:2(IDX:0-1)", "node[1-2]", "JobId=7", "JobState=", "EndTime=", "Unknown",
         "2026-11-25T22:32:24", "9" * 30, "٣", "²", "\x00", "é"]
NOISE = st.lists(st.sampled_from(WORDS) | st.text(max_size=4), max_size=30).map("".join)


def mutated(text: str) -> st.SearchStrategy[str]:
    """Recorded output with pieces cut out, repeated or replaced by noise."""
    return st.tuples(st.integers(0, len(text)), st.integers(0, len(text)), NOISE).map(
        lambda t: text[:min(t[0], t[1])] + t[2] + text[max(t[0], t[1]):])


def recorded(*names: str) -> st.SearchStrategy[str]:
    return st.sampled_from([(RECORDED / n).read_text() for n in names]).flatmap(mutated) | NOISE


@FUZZ
@given(recorded("scontrol_running.txt", "scontrol_completed.txt", "scontrol_held.txt", "scontrol_cancelled.txt"))
def test_any_scontrol_show_job_output(stdout: str) -> None:
    fields = parse_scontrol(stdout)
    answered(lambda: end_time_from_scontrol(fields))
    answered(lambda: status_from_scontrol(fields))


@FUZZ
@given(recorded("sinfo_nodes.txt"))
def test_any_sinfo_output(stdout: str) -> None:
    answered(lambda: parse_sinfo_nodes(stdout))


@FUZZ
@given(NOISE)
def test_any_squeue_output(stdout: str) -> None:
    answered(lambda: parse_squeue(stdout))
    answered(lambda: parse_squeue("\t".join(["7", "RUNNING", "1:00", "5:00", "2", "node[1-2]", stdout])))


@FUZZ
@given(recorded("sbatch_parsable.txt", "sbatch_version.txt"))
def test_any_sbatch_output_job_id_or_version(stdout: str) -> None:
    answered(lambda: parse_job_id(stdout))
    answered(lambda: check_job_id(stdout))
    answered(lambda: parse_slurm_version(stdout))
    gpus_of_gres(stdout)


@FUZZ
@given(NOISE)
def test_any_value_typed_for_slurm(text: str) -> None:
    answered(lambda: parse_time(text))
    answered(lambda: check_signal(text))
    answered(lambda: parse_sizes(text))
    answered(lambda: whole_number("SLURM_PROCID", text))


SLURM_VARIABLES = ["SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS",
                   "SLURM_NNODES", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                   "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "RANK",
                   "WORLD_SIZE", "LOCAL_RANK"]
PLAUSIBLE = ["0", "1", "2", "4", "42", "-1", "2(x2)", "node[1-2]", "node1", "99999999999999999999", "", " 3", "٣"]


@FUZZ
@given(st.dictionaries(st.sampled_from(SLURM_VARIABLES), st.sampled_from(PLAUSIBLE) | NOISE, max_size=12))
def test_any_launcher_environment(environ: dict[str, str]) -> None:
    answered(lambda: detect(environ, free_port=lambda: 29500))

"""Scripts of any text: linted, never a traceback, whatever their quotes, heredocs, nesting or digits; and
`#SBATCH` lines read back by sbatch's tokenizer without an exception."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tests.unit.fuzz.conftest import FUZZ, answered

from torchslurm.jobs.sbatch import sbatch_split
from torchslurm.lint.report import lint

PIECES = ["#!/bin/bash\n", "#SBATCH ", "--nodes=", "-N ", "--ntasks-per-node=", "--gpus-per-node=", "--time=",
          "--signal=", "srun ", "-K ", "torchrun ", "--nproc-per-node=", "--nnodes=", "deepspeed ", "--num_gpus=",
          "accelerate launch ", "python ", "-m ", "t.py ", "bash -c ", "eval ", "export ", "A=", "$A", "${A:-",
          "}", "$(", ")", "$((", "((", "))", "`", "'", '"', "\\", "\n", "\r\n", ";", "&", "|", "<<EOF\n", "EOF\n",
          "<<-'X'\n", "\tX\n", "<<<", "(", "#", " ", "2", "²", "٣", "9" * 25, "ARGS=(", "\"${ARGS[@]}\"", "trap ",
          "case $SLURM_PROCID in\n", "0) ", ";;\n", "esac\n", "$SLURM_PROCID", "MASTER_PORT=", "\x00"]
SCRIPTS = st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=60).map("".join)


@FUZZ
@given(SCRIPTS)
def test_any_script_is_linted(text: str) -> None:
    findings = lint(text)
    assert all(f.hint for f in findings if f.severity in ("error", "warning"))


@FUZZ
@given(SCRIPTS)
def test_any_sbatch_line_is_split(text: str) -> None:
    answered(lambda: sbatch_split(text))

"""Settings files: YAML read without YAML 1.1's base-60 numbers, so Slurm times keep their meaning."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.configfile import load_yaml
from torchslurm.jobs import spec as jobspec
from torchslurm.jobs.sbatch import render


@pytest.mark.parametrize(("value", "seconds"), [("1:00:00", 3600), ("30:00", 1800), ("1-12:00:00", 129600)])
def test_an_unquoted_time_in_a_yaml_job_spec_is_the_slurm_time_written(tmp_path: Path, value: str,
                                                                       seconds: int) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(f"script: train.py\ntime: {value}\n")
    spec = jobspec.load(path)
    assert spec.time == value and jobspec.parse_time(spec.time) == seconds
    assert f"#SBATCH --time={value}\n" in render(spec)


def test_other_yaml_scalars_are_read_as_yaml_reads_them() -> None:
    text = "a: 12\nb: 0.5\nc: 1_000\nd: 0x10\ne: -3\nf: .inf\ng: true\nh: 1.5e+3\ni: null\nj: '7'\nk: 1:2\n"
    assert load_yaml(text) == {"a": 12, "b": 0.5, "c": 1000, "d": 16, "e": -3, "f": float("inf"), "g": True,
                               "h": 1500.0, "i": None, "j": "7", "k": "1:2"}

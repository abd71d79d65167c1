"""A sweep's job array: `--array` with %N, the case block that picks a point (run by bash, with an
`srun` that records what it was given, on hostile values), and the submission into sweep.json."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from torchslurm.jobs.sbatch import render
from torchslurm.jobs.slurm import SlurmClient
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.sweep import Sweep, expand, manifest
from torchslurm.jobs.sweepscript import array_range, array_spec, render_array, submit_array
from torchslurm.jobs.sweepstate import read_manifest

HOSTILE = ["it's", "a b", "$HOME", "`id`", "x;exit 9", "\\", '"', "*", "~", "é", "-v"]


def sweep_of(tmp_path: Path, max_parallel: int | None = 2) -> Sweep:
    return Sweep("hostile sweep", {"tag": tuple(HOSTILE)}, ({"lr": 0.5, "seed": 3},), max_parallel, tmp_path / "r o")


def test_array_range_folds_runs_and_adds_the_throttle() -> None:
    assert array_range([0, 1, 2, 3], 2) == "0-3%2"
    assert array_range([7, 0, 1, 2, 3, 5, 8], None) == "0-3,5,7-8"
    assert array_range([4], 2) == "4%2"


def test_an_array_of_no_tasks_is_our_bug_not_an_empty_range() -> None:
    """The CLI submits nothing when no point is left; asked for an empty array, array_range says why."""
    with pytest.raises(AssertionError) as info:
        array_range([], 2)
    assert str(info.value) == "an array needs at least one task"


def test_the_array_spec_asks_for_the_points_and_names_the_logs_by_task() -> None:
    spec = JobSpec(script="t.py")
    sweep = Sweep("s", max_parallel=3)
    assert (array_spec(spec, sweep, [0, 1, 2, 5]).array, array_spec(spec, sweep, [0]).output) == ("0-2,5%3",
                                                                                                  "%x-%A_%a.out")
    assert array_spec(JobSpec(script="t.py", output="logs/%a.log"), sweep, [0]).output == "logs/%a.log"
    text = render_array(array_spec(spec, sweep, [0, 1]), sweep, expand(Sweep("s", {"lr": (1, 2)})))
    assert "#SBATCH --array=0-1%3\n" in text and "#SBATCH --output=%x-%A_%a.out\n" in text


def run_task(script: Path, task: str | None, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the array's script as Slurm would run task `task`, with an srun that writes the argv it got
    and the sweep's variables as JSON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "srun.json"
    fake = bin_dir / "srun"
    fake.write_text("#!/usr/bin/env python3\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv[1:], 'sweep': os.environ.get('TORCHSLURM_SWEEP'), "
                    f"'point': os.environ.get('TORCHSLURM_SWEEP_POINT')}}, open({str(record)!r}, 'w'))\n")
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": "/nonexistent"}
    if task is not None:
        env["SLURM_ARRAY_TASK_ID"] = task
    record.unlink(missing_ok=True)
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=30)
    data = json.loads(record.read_text()) if record.exists() else {"argv": []}
    return result, [data.get("sweep"), data.get("point"), *data["argv"]]


def test_each_task_runs_its_point_with_every_value_as_given(tmp_path: Path) -> None:
    sweep = sweep_of(tmp_path)
    points = expand(sweep)
    spec = array_spec(JobSpec(script="train me.py", args=("epochs=1", "$X")), sweep, [p.index for p in points])
    script = tmp_path / "array.sbatch"
    script.write_text(render_array(spec, sweep, points))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    for point in points:
        result, (name, folder, *argv) = run_task(script, str(point.index), tmp_path)
        assert result.returncode == 0, result.stderr
        assert (name, folder) == ("hostile sweep", point.dir)
        command = argv[argv.index("python"):]
        expected = [f"{k}={v}" for k, v in point.overrides.items()]
        assert command == ["python", "train me.py", "epochs=1", "$X", *expected,
                           f"run_dir={tmp_path}/r o/hostile sweep/{point.dir}"], command
    assert points[-1].overrides == {"lr": 0.5, "seed": 3}


@pytest.mark.parametrize("task", ["99", "", None])
def test_a_task_the_script_has_no_point_for_exits_2_before_srun(tmp_path: Path, task: str | None) -> None:
    sweep = Sweep("s", {"lr": (1, 2)})
    points = expand(sweep)
    script = tmp_path / "array.sbatch"
    script.write_text(render_array(array_spec(JobSpec(script="t.py"), sweep, [1]), sweep, points[1:]))
    result, recorded = run_task(script, task, tmp_path)
    assert result.returncode == 2 and recorded == [None, None]
    assert f"torchslurm sweep s: this script runs array tasks 1, not task {task or '(none)'}" in result.stderr


def test_the_array_script_is_the_jobs_script_around_the_point() -> None:
    """Everything but the point (preemption, requeue, the secret, the launch) is render()'s."""
    spec = JobSpec(script="t.py", preemptible=True, launch="torchrun", nodes=2)
    sweep = Sweep("s", {"lr": (1,)})
    text = render_array(array_spec(spec, sweep, [0]), sweep, expand(sweep))
    plain = render(array_spec(spec, sweep, [0]))
    block_start, launch_end = text.index("# sweep s:"), text.index("export TORCHSLURM_SWEEP=s")
    assert text[:block_start] == plain[:block_start]
    assert 't.py "${point_args[@]}" || status=$?\n' in text  # torchrun's workers get the point too
    assert text.count('"${point_args[@]}"') == 1 and launch_end > block_start


def test_a_submission_writes_its_script_and_appends_to_sweep_json(tmp_path: Path) -> None:
    sweep = sweep_of(tmp_path, max_parallel=None)
    points = expand(sweep)
    submitted: list[list[str]] = []

    def sbatch(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        submitted.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, f"{100 + len(submitted)}\n", "")

    client = SlurmClient(run=sbatch)  # type: ignore[arg-type]
    done, first = submit_array(JobSpec(script="t.py"), sweep, manifest(sweep, points), range(len(points)), client,
                               clock=lambda: 5.0)
    assert (first.job_id, first.indices, first.time) == ("101", tuple(range(len(points))), 5.0)
    assert Path(first.script) == sweep.sweep_dir / "t.sbatch" and submitted[0][-1] == first.script
    assert "#SBATCH --array=0-11\n" in Path(first.script).read_text()
    assert f"#SBATCH --output={sweep.sweep_dir}/%x-%A_%a.out" in Path(first.script).read_text().replace('"', "")
    again, second = submit_array(JobSpec(script="t.py"), sweep, done, [3, 11], client, clock=lambda: 6.0)
    assert Path(second.script).name == "t-2.sbatch" and second.indices == (3, 11)
    text = Path(second.script).read_text()
    assert "#SBATCH --array=3,11\n" in text and "\n  3) " in text and "\n  0) " not in text
    assert read_manifest(sweep.sweep_dir) == again and [s.job_id for s in again.submissions] == ["101", "102"]

"""The job's warning signal while a rank starts (importing torch, building its model): the rank lives on,
and a signal that came once torchslurm.init() ran is still a stop. The rank is started by the very srun
line `torchslurm script` writes (srun itself replaced by its command), as a real process."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.multiproc.conftest import clean_environ

from torchslurm.exitcodes import PREEMPTED_EXIT_CODE
from torchslurm.jobs.sbatch import render
from torchslurm.jobs.spec import JobSpec

pytestmark = pytest.mark.multiproc

SCRIPT = Path(__file__).parent / "scripts" / "startup_signal.py"
FAKE_SRUN = '#!/bin/bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n'  # drop srun's options, run the rest


def _wait_for_phase(run_dir: Path, name: str, job: subprocess.Popen[str]) -> int:
    """The rank's pid once it waits in phase `name`."""
    deadline = time.monotonic() + 120
    while not (run_dir / "phase").exists() or (run_dir / "phase").read_text().split()[0] != name:
        assert job.poll() is None, f"the job ended before phase {name}: {job.returncode}"
        assert time.monotonic() < deadline, f"no phase {name}"
        time.sleep(0.02)
    return int((run_dir / "phase").read_text().split()[1])


def test_the_warning_signal_during_start_up_is_survived_and_honoured(tmp_path: Path) -> None:
    spec = JobSpec(script=str(SCRIPT), args=(str(tmp_path),), python=sys.executable, preemptible=True,
                   requeue=False)
    script = render(spec)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text(FAKE_SRUN)
    (tmp_path / "bin" / "srun").chmod(stat.S_IRWXU)
    launch = [line for line in script.splitlines() if line.startswith(("export ", "status=", "srun "))]
    commands = "\n".join([*launch, 'exit "$status"'])  # the script's launch, without the wait for a requeue
    env = clean_environ(PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", TORCHSLURM_CHECK_PERIOD_S="0")
    job = subprocess.Popen(["bash", "-c", f"set -e\n{commands}"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        os.kill(_wait_for_phase(tmp_path, "importing", job), signal.SIGUSR2)  # no handler of torchslurm's yet
        (tmp_path / "go-importing").touch()
        os.kill(_wait_for_phase(tmp_path, "building", job), signal.SIGUSR2)  # after init(), before the Trainer
        (tmp_path / "go-building").touch()
        out, _ = job.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # whatever is left of the job's session
    assert job.returncode == PREEMPTED_EXIT_CODE, out
    assert "stopped early: True at step 1" in out

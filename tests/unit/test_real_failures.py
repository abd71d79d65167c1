"""Failures rebuilt from public bug reports (tests/fixtures/real_failures/), each with the verdict it must get.

Two kinds of case, each citing its report (`source`) and saying what went wrong (`why`):
- `*.sbatch`, read by lint. Header lines `# expect: clean`, `# expect: error RULE` (RULE must report an
  error) or `# expect: warning RULE` (RULE must report a warning, and nothing an error). A script with no
  `error` line is a correct launch: no error allowed, here and in tests/fixtures/lint_corpus/.
- `*.json`, the environment each task of a job saw, decided by the runtime (`detect`, then
  `choose_device`, as `torchslurm.init()` does) and optionally by one of the doctor's checks. Each task
  expects `"trains"` (with its placement, device and the warning it must raise, if any; no warning
  otherwise) or `"refused"` (with a substring of the error). `gpus_distinct`: no two tasks of a node
  use one physical GPU.

`python tests/unit/test_real_failures.py` prints the tally: cases caught, missed and false alarms.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from torchslurm.cli.lint import bash_syntax
from torchslurm.doctor.checks import check_gpus, check_placement
from torchslurm.doctor.facts import Check, Facts, TorchFacts
from torchslurm.errors import TorchSlurmError
from torchslurm.lint.report import lint
from torchslurm.runtime import devices
from torchslurm.runtime.distenv import DistEnv, detect

FIXTURES = Path(__file__).parents[1] / "fixtures"
REAL = FIXTURES / "real_failures"
SCRIPTS = sorted(REAL.glob("*.sbatch"))
JOBS = sorted(REAL.glob("*.json"))
BOTH_CORPORA = sorted((FIXTURES / "lint_corpus").glob("*.sbatch")) + SCRIPTS
EXPECT = re.compile(r"^# expect: (clean|(?:error|warning) [a-z-]+)$", re.MULTILINE)
SOURCE = re.compile(r"^# source: https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+$", re.MULTILINE)
DOCTOR_CHECKS: dict[str, Callable[[Facts], Check]] = {"placement": check_placement, "gpus": check_gpus}


# ---- lint ----------------------------------------------------------------------------------------


def expected(path: Path) -> list[tuple[str, str]]:
    """(severity, rule) pairs the script's header demands; [] for `# expect: clean`."""
    lines = EXPECT.findall(path.read_text())
    assert lines, f"{path.name} has no `# expect:` line"
    pairs = [line.split(maxsplit=1) for line in lines if line != "clean"]
    return [(severity, rule) for severity, rule in pairs]


def is_correct(path: Path) -> bool:
    """No error expected: lint must report none."""
    return all(severity != "error" for severity, _ in expected(path))


def is_failure(path: Path) -> bool:
    """Rebuilt from a launch that failed (`bug_*`), not from a correct one (`ok_*`)."""
    return path.name.startswith("bug_")


def lint_findings(path: Path) -> set[tuple[str, str]]:
    findings = lint(path.read_text(), syntax=bash_syntax if shutil.which("bash") else None)
    return {(f.severity, f.code) for f in findings}


def script_verdict(path: Path) -> str:
    """'ok' when lint says what the header demands, else what went wrong."""
    found = lint_findings(path)
    missing = [f"{severity} {rule}" for severity, rule in expected(path) if (severity, rule) not in found]
    errors = sorted(code for severity, code in found if severity == "error")
    if is_correct(path) and errors:
        return f"false alarm: {', '.join(errors)}"
    return f"missed: {', '.join(missing)} (found {sorted(found)})" if missing else "ok"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_lint_verdict(path: Path) -> None:
    assert script_verdict(path) == "ok"


@pytest.mark.parametrize("path", [p for p in BOTH_CORPORA if is_correct(p)], ids=lambda p: p.stem)
def test_no_correct_script_gets_an_error(path: Path) -> None:
    assert sorted(code for severity, code in lint_findings(path) if severity == "error") == []


def test_every_script_parses_in_bash_and_cites_its_report() -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    assert [p.name for p in SCRIPTS if bash_syntax(p.read_text()) is not None] == []
    assert [p.name for p in SCRIPTS if not SOURCE.search(p.read_text()) or "# why: " not in p.read_text()] == []


# ---- runtime and doctor --------------------------------------------------------------------------


def runtime_warnings(env: DistEnv, task: dict[str, Any]) -> list[str]:
    """What `torchslurm.init()` warns about for this task: the placement's warnings, GPUs torch does not see,
    and ranks crowding the task's CPUs (`usable_cpus`: its CPU affinity)."""
    environ, count = task["environ"], task["cuda_device_count"]
    found = [warning.message for warning in env.warnings]
    cpus = task.get("usable_cpus", 64)
    unseen = devices.gpus_unseen(environ, count, task.get("torch_cuda", "12.4"))
    crowded = devices.cpu_oversubscription(environ, env.gpu_sharers, cpus)
    lost = devices.cpus_per_task_lost(environ, cpus)
    return found + [problem.message for problem in (unseen, crowded, lost) if problem is not None]


def decide(task: dict[str, Any]) -> tuple[DistEnv, devices.DeviceChoice]:
    env = detect(task["environ"], free_port=lambda: 29400)
    return env, devices.choose_device(task["environ"], env.local_rank, env.gpu_sharers, task["cuda_device_count"])


def task_verdict(task: dict[str, Any]) -> str:
    """'ok' when the runtime decides this task as the case demands, else what went wrong."""
    try:
        env, device = decide(task)
    except TorchSlurmError as exc:
        if task["expect"] == "refused" and task["error"] in str(exc):
            return "ok"
        return f"refused: {exc.message}"
    if task["expect"] == "refused":
        return f"trains ({env.reason}) but must be refused: {task['error']}"
    got = {"rank": env.rank, "world_size": env.world_size, "local_rank": env.local_rank,
           "local_world_size": env.local_world_size, "master_addr": env.master_addr, "device": device.name}
    wrong = {key: value for key, value in got.items() if key in task and task[key] != value}
    if wrong:
        return f"wrong {wrong}, expected {({key: task[key] for key in wrong})}"
    node = task["environ"].get("SLURMD_NODENAME")
    if env.hosts_store and node and env.master_addr not in (node, "127.0.0.1"):
        return f"this process serves the store on {node} but the master is {env.master_addr}"
    warned = runtime_warnings(env, task)
    if "warns" in task and not any(task["warns"] in message for message in warned):
        return f"no warning about {task['warns']!r} (warnings: {warned})"
    if "warns" not in task and warned:
        return f"unexpected warnings: {warned}"
    return "ok"


def doctor_verdict(task: dict[str, Any]) -> str:
    want = task["doctor"]
    cuda = task.get("torch_cuda", "12.4")
    torch = TorchFacts(version="2.5.1", cuda=cuda, cuda_device_count=task["cuda_device_count"],
                       nccl="2.21.5" if cuda else None, gloo=True)
    facts = Facts(environ=task["environ"], hostname=task["environ"].get("SLURMD_NODENAME", "localhost"), torch=torch,
                  usable_cpus=task.get("usable_cpus", 64))
    check = DOCTOR_CHECKS[want["check"]](facts)
    if check.status != want["status"] or want.get("detail", "") not in check.detail:
        return f"doctor {check.name}: {check.status}: {check.detail}"
    return "ok"


def physical_gpu(task: dict[str, Any]) -> tuple[str, str] | None:
    """(node, physical GPU) this task computes on: its device's entry in CUDA_VISIBLE_DEVICES."""
    try:
        _, device = decide(task)
    except TorchSlurmError:
        return None
    visible = task["environ"]["CUDA_VISIBLE_DEVICES"].split(",")
    return (task["environ"]["SLURMD_NODENAME"], visible[device.index]) if device.kind == "cuda" else None


def job_verdict(path: Path) -> str:
    case = json.loads(path.read_text())
    problems = [f"task {n}: {verdict}" for n, task in enumerate(case["tasks"])
                for verdict in (task_verdict(task), doctor_verdict(task) if "doctor" in task else "ok")
                if verdict != "ok"]
    gpus = [gpu for gpu in map(physical_gpu, case["tasks"]) if gpu is not None]
    if case.get("gpus_distinct") and len(set(gpus)) != len(gpus):
        problems.append(f"two tasks on one GPU: {gpus}")
    return "; ".join(problems) or "ok"


def is_correct_job(path: Path) -> bool:
    """A job that must train with nothing to say: no refusal and no warning expected."""
    tasks = json.loads(path.read_text())["tasks"]
    return all(task["expect"] == "trains" and "warns" not in task for task in tasks)


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_runtime_verdict(path: Path) -> None:
    assert job_verdict(path) == "ok"


def test_every_job_cites_its_report() -> None:
    for path in JOBS:
        case = json.loads(path.read_text())
        assert SOURCE.search(f"# source: {case['source']}") and case["why"], path.name
        assert all(task["expect"] in ("trains", "refused") for task in case["tasks"]), path.name


# ---- the set as a whole --------------------------------------------------------------------------


def test_the_set_is_large_and_mixed() -> None:
    assert len(SCRIPTS) + len(JOBS) >= 36
    assert sum(not is_failure(p) for p in SCRIPTS) >= 10 and sum(map(is_failure, SCRIPTS)) >= 10
    assert all(p.name.startswith(("bug_", "ok_")) for p in SCRIPTS)
    assert sum(map(is_correct_job, JOBS)) >= 4 and sum(not is_correct_job(p) for p in JOBS) >= 4


def tally() -> dict[str, dict[str, int]]:
    """Per corpus: failure cases caught and missed; correct cases, and those that failed (for lint a false
    alarm, an error on a correct script; for the runtime a correct job refused, warned about or placed wrong)."""
    corpora = {"lint_corpus": (sorted((FIXTURES / "lint_corpus").glob("*.sbatch")), is_failure, script_verdict),
               "real_failures lint": (SCRIPTS, is_failure, script_verdict),
               "real_failures runtime": (JOBS, lambda p: not is_correct_job(p), job_verdict)}
    counts = {}
    for name, (paths, failure, verdict) in corpora.items():
        results = [(failure(p), verdict(p) == "ok") for p in paths]
        counts[name] = {"caught": sum(ok for bad, ok in results if bad),
                        "missed": sum(not ok for bad, ok in results if bad),
                        "correct": sum(not bad for bad, _ in results),
                        "correct_failed": sum(not ok for bad, ok in results if not bad)}
    return counts


def test_tally_counts_the_first_corpus_fully_caught() -> None:
    bugs = [p for p in (FIXTURES / "lint_corpus").glob("*.sbatch") if is_failure(p)]
    assert tally()["lint_corpus"] == {"caught": len(bugs), "missed": 0, "correct": len(BOTH_CORPORA) - len(SCRIPTS)
                                      - len(bugs), "correct_failed": 0}


if __name__ == "__main__":
    for corpus, numbers in tally().items():
        print(f"{corpus}: " + ", ".join(f"{key} {value}" for key, value in numbers.items()))
    for path in SCRIPTS + JOBS:
        verdict = script_verdict(path) if path.suffix == ".sbatch" else job_verdict(path)
        if verdict != "ok":
            print(f"{path.name}: {verdict}")

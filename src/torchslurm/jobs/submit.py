"""Python API: `torchslurm.submit(spec) -> Job` with .id, .status(), .wait(), .logs(), .cancel().

Effects only through a SlurmClient (the seam) and the run directory; no torch.
"""

from __future__ import annotations

import dataclasses
import getpass
import itertools
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torchslurm.errors import ConfigError, SlurmError
from torchslurm.jobs.findings import Finding, capacity, log_dir_missing, validate
from torchslurm.jobs.sbatch import rank_output, render
from torchslurm.jobs.slurm import SlurmClient
from torchslurm.jobs.slurmoutput import JobStatus
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.spelling import SPEC_FILE, Spelling
from torchslurm.runtime.runchecks import data_file_kind, first_line, script_problem, shell_script_kind

logger = logging.getLogger(__name__)

# A placeholder of Slurm's filename patterns (sbatch(1), "filename pattern"): `%%`, or `%` with an
# optional zero-padding width and a letter (`%j`, `%4t`).
_PLACEHOLDER = re.compile(r"%(%|[0-9]*[A-Za-z])")


def expand_pattern(pattern: str, known: Mapping[str, str]) -> str:
    """`pattern` with the placeholders in `known` filled in (`{"x": job name, "j": job id, "u": user}`)
    and `%%` as `%`; the others are left for Slurm."""
    def one(m: re.Match[str]) -> str:
        return "%" if m.group(1) == "%" else known.get(m.group(1), m.group(0))

    return _PLACEHOLDER.sub(one, pattern)


def unknown_placeholders(pattern: str, known: Mapping[str, str]) -> list[str]:
    """The placeholders of `pattern` that `expand_pattern` leaves for Slurm (`%j`, `%N`, ...)."""
    return [m.group(0) for m in _PLACEHOLDER.finditer(pattern) if m.group(1) != "%" and m.group(1) not in known]


def prepare(spec: JobSpec, run_dir: Path, render_with: Callable[[JobSpec], str] = render) -> tuple[JobSpec, Path]:
    """Put relative log patterns into `run_dir`, write the script there (a file of its own,
    `new_script`, rendered by `render_with`); (spec used, script path)."""
    run_dir = run_dir.resolve()
    spec = placed(spec, run_dir)
    for name in ("output", "error"):
        value = getattr(spec, name)
        if value is not None:
            _make_log_directory(name, value, spec.name)
    return spec, new_script(run_dir, spec.name, render_with(spec))


def placed(spec: JobSpec, run_dir: Path) -> JobSpec:
    """`spec` with its relative log patterns placed in `run_dir`."""
    changes: dict[str, str] = {}
    for name in ("output", "error"):
        value = getattr(spec, name)
        if value is not None and not value.startswith("/"):
            changes[name] = str(run_dir / value)
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def new_script(run_dir: Path, name: str, text: str) -> Path:
    """Write `text` to a file no other submission has: `<name>.sbatch`, else `<name>-2.sbatch`, `-3`, ...
    Created exclusively (O_EXCL), so two submissions at once never write one file, and every
    submission's script stays beside its logs."""
    for count in itertools.count(1):
        script = run_dir / (f"{name}.sbatch" if count == 1 else f"{name}-{count}.sbatch")
        try:
            with script.open("x", encoding="utf-8") as out:
                out.write(text)
        except FileExistsError:
            continue
        return script
    raise AssertionError("unreachable: itertools.count never ends")


def _make_log_directory(name: str, pattern: str, job_name: str) -> None:
    """Create the folder of a log file pattern: Slurm does not, and a job whose log folder is missing
    fails before printing anything. %x (the job name) and %u (the user) are known before submission;
    the other placeholders (%j, %A, %N, ...) are not, so they cannot name a folder made beforehand."""
    parent = str(Path(pattern).parent)
    known = {"x": job_name, "u": getpass.getuser()}
    if unknown_placeholders(parent, known):
        raise ConfigError(f"{name}={pattern}: its folder holds a placeholder known only once the job runs, and "
                          "Slurm does not create folders.",
                          f"keep %j and the like in the file name, e.g. {name}=logs/%x-%j.out.")
    folder = expand_pattern(parent, known)
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{name}={pattern}: cannot create {folder}/ ({exc.strerror}); Slurm does not create it "
                          "and the job would fail before printing anything.", "give a folder you can write, "
                          f"e.g. {name}=logs/%x-%j.out (placed in the run directory).") from exc


def script_missing(spec: JobSpec, cwd: Path, submitting: bool) -> list[Finding]:
    """The training script, looked up where the job will run it: sbatch starts the job in the
    directory it was called from (the spec has no working directory of its own).

    An error for `submit` (the job would wait in the queue, then fail at once); a warning for
    `script`, which only prints, maybe for another machine. A file that exists only on the compute
    nodes is still possible: --force submits anyway.
    """
    kind = data_file_kind(spec.script)
    if kind is not None:
        return [Finding("error" if submitting else "warning", "script-is-config",
                        f"script {spec.script!r} is a {kind} file: the job would run `python {spec.script}` and fail "
                        "at once.",
                        f"a job spec goes after --spec (`--spec {spec.script}`), the training script after the "
                        "flags or as script: in the spec; a config file of the script's own goes after the script, "
                        "among its arguments")]
    path = cwd / spec.script
    shell = None if path.is_dir() else shell_script_kind(spec.script, first_line(path))
    if shell is not None:
        return [Finding("error" if submitting else "warning", "script-is-shell",
                        f"script {spec.script!r} is {shell}: the job would run `python {spec.script}` and fail at "
                        "once.",
                        "give the Python training script: torchslurm writes the sbatch script around it "
                        f"(`torchslurm script` shows it); to submit a script of your own, run `sbatch {spec.script}` "
                        f"(and check it first with `torchslurm lint {spec.script}`)")]
    if script_problem(str(path)) is None:  # what `torchslurm run` accepts: a file, or a folder with __main__.py
        return []
    what = "is a directory" if path.is_dir() else "does not exist"
    if submitting:
        return [Finding("error", "script-missing",
                        f"script {spec.script!r} {what}: checked {path}; the job would wait in the queue and "
                        "then fail.",
                        f"give the training script's path (relative paths are taken from {cwd}, where the job "
                        "runs); if it exists only on the compute nodes, pass --force (force=True from Python)")]
    return [Finding("warning", "script-missing", f"script {spec.script!r} {what}: checked {path}.",
                    "give the training script's path; relative paths are taken from the directory you run "
                    "sbatch in")]


def log_dirs(spec: JobSpec, base: Path) -> dict[str, Path]:
    """The folders of the output/error patterns (relative ones taken from `base`); those with a
    placeholder in them are left out: Slurm fills those in per job."""
    out: dict[str, Path] = {}
    for key in ("output", "error"):
        value = getattr(spec, key)
        parent = None if value is None else Path(value).parent
        if parent is not None and parent != Path(".") and "%" not in str(parent):
            out[key] = base / parent
    return out


def missing_log_dirs(spec: JobSpec, cwd: Path) -> list[Finding]:
    """A warning for each log folder that does not exist: Slurm does not create it (what `torchslurm
    lint` says of a script, [log-dir]). For `script`; `submit` creates them instead (`prepare`)."""
    return [log_dir_missing(key, getattr(spec, key), str(path)) for key, path in log_dirs(spec, cwd).items()
            if not path.is_dir()]


def never_starts(spec: JobSpec, client: SlurmClient, spelling: Spelling = SPEC_FILE) -> list[Finding]:
    """[never-starts] against the partition's nodes as sinfo lists them; nothing when sinfo cannot answer."""
    nodes = client.partition_nodes(spec.partition)
    return [] if nodes is None else capacity(spec, nodes, spelling)


def submit(spec: JobSpec, run_dir: Path | str | None = None, client: SlurmClient | None = None,
           force: bool = False, slurm_version: str | None = None) -> Job:
    """Validate (also against what the partition's nodes have), render into `run_dir` (default
    ./torchslurm-runs/<name>), sbatch, return the Job."""
    client = client or SlurmClient()
    if not force:
        found = [*script_missing(spec, Path.cwd(), True), *validate(spec, slurm_version), *never_starts(spec, client)]
        errors = [f for f in found if f.severity == "error"]
        if errors:
            raise ConfigError(f"the job spec has {len(errors)} error(s):\n  " + "\n  ".join(str(f) for f in errors)
                              + "\nNothing was submitted.", "fix them (or pass force=True / --force to submit "
                              "anyway).")
    directory = Path(run_dir) if run_dir is not None else Path("torchslurm-runs") / spec.name
    directory.mkdir(parents=True, exist_ok=True)
    used, script = prepare(spec, directory)
    job_id = client.submit(script)
    logger.info("submitted job %s (%s)", job_id, script)
    return Job(job_id, client, spec=used, script=script)


@dataclass
class Job:
    """A submitted job. `Job(id)` also works for jobs submitted elsewhere (log paths from scontrol)."""

    id: str
    client: SlurmClient = field(default_factory=SlurmClient)
    spec: JobSpec | None = None
    script: Path | None = None

    def status(self) -> JobStatus:
        return self.client.status(self.id)

    def wait(self, timeout_s: float | None = None, poll_s: float = 2.0,
             sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> JobStatus:
        """Poll until the job reaches a final state; SlurmError after `timeout_s`."""
        deadline = None if timeout_s is None else clock() + timeout_s
        while True:
            st = self.status()
            if st.finished:
                return st
            if deadline is not None and clock() >= deadline:
                raise SlurmError(f"job {self.id} still {st.state} after {timeout_s:g} s.",
                                 f"`torchslurm status {self.id}` shows why (Reason); wait longer or cancel it.")
            sleep(poll_s)

    def log_paths(self, st: JobStatus | None = None) -> list[Path]:
        """The job's stdout (and stderr, when separate) files as Slurm expanded them."""
        st = st or self.status()
        paths = [Path(p) for p in dict.fromkeys((st.stdout, st.stderr)) if p]
        return paths

    def rank_log_path(self, rank: int, st: JobStatus | None = None) -> Path | None:
        """The per-rank file (spec per_rank_output), if the job wrote one."""
        st = st or self.status()
        if not st.stdout:
            return None
        # the pattern sbatch gave srun, applied to the output path Slurm expanded (%x, %j)
        candidate = Path(rank_output(st.stdout).replace("%t", str(rank)))
        return candidate if candidate.exists() else None

    def logs(self, rank: int | None = None) -> str:
        """The job's output so far; with `rank`, only that rank's lines (per-rank file or `R: ` labels)."""
        if rank is not None and rank < 0:
            raise ConfigError(f"--rank={rank} is negative.", "ranks count from 0 (--rank 0 is the first).")
        st = self.status()
        if rank is not None and rank >= st.tasks > 0:  # else an empty answer, as if the rank printed nothing
            raise ConfigError(f"--rank={rank} but job {self.id} has {st.tasks} task(s): ranks 0 to {st.tasks - 1}.",
                              "pick one of those (--rank 0 is the first), or leave --rank out for all output.")
        if rank is not None:
            per_rank = self.rank_log_path(rank, st)
            if per_rank is not None:
                return per_rank.read_text(errors="replace")
        paths = self.log_paths(st)
        if not paths or not paths[0].exists():
            where = paths[0] if paths else "(no StdOut in scontrol)"
            raise SlurmError(f"job {self.id} has no log file yet at {where}.", "a pending job has not started; "
                             "otherwise check that the output directory exists on the nodes.")
        text = paths[0].read_text(errors="replace")
        return text if rank is None else filter_rank(text, rank)

    def cancel(self) -> None:
        self.client.cancel(self.id)


def filter_rank(text: str, rank: int) -> str:
    """Lines srun --label prefixed with `rank: ` (padded for wide ranks), without the prefix."""
    pattern = re.compile(rf"^\s*{rank}: ?(.*)$")
    return "".join(m.group(1) + "\n" for line in text.split("\n") if (m := pattern.match(line)))

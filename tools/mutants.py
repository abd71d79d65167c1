"""Mutation testing of torchslurm's core with mutmut, one shard (a family of modules) at a time.

    python tools/mutants.py SHARD [SHARD ...] [--jobs N] [--survivors] [--fresh]
    python tools/mutants.py --list            the shards, their modules and tests
    python tools/mutants.py --report SHARD    the table of the last run, without running anything
    make mutants SHARD=hostlist               the same through make

Each shard mutates only its modules and runs only their fast unit tests (mutmut runs, for each
mutant, just the tests that call the mutated function). mutmut works on a copy of the tree; this
driver gives every shard a folder of its own, `mutants/<shard>/`, holding links to src/ and tests/
and a pyproject.toml whose [tool.mutmut] table is the repository's plus the shard's modules and
tests, so shards never invalidate each other's results and a second run redoes only what changed.

The table it prints (and writes to mutants/<shard>/report.md): per module the mutants, those killed
(a test failed, or the tests ran past their time limit), those that survived, and those of the
survivors listed as equivalent in tools/equivalent_mutants.toml (no program behaviour differs; each
with its reason). score = caught / (mutants - equivalent). See docs/testing.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "mutants"
EQUIVALENT = ROOT / "tools" / "equivalent_mutants.toml"


@dataclass(frozen=True)
class Shard:
    """Modules (paths under src/torchslurm/, without .py) mutated together, and the tests run on them."""

    modules: tuple[str, ...]
    tests: tuple[str, ...]
    why: str
    forkserver: bool = False
    """Fork each mutant's test run from a server process rather than from mutmut's own (tests that import torch)."""
    reads: tuple[str, ...] = ()
    """Folders besides src/ and tests/ that the tests read (mutmut runs them in its copy of the tree)."""


SHARDS = {
    "hostlist": Shard(("hostlist", "runtime/ports"),
                      ("tests/unit/test_hostlist.py", "tests/unit/runtime/test_ports.py"),
                      "where rank 0 is: Slurm hostlists and the derived master port"),
    "configfile": Shard(("configfile", "runtime/variables"),
                        ("tests/unit/test_configfile.py", "tests/unit/runtime/test_variables.py"),
                        "numbers and settings read from text: config files, key=value, environment variables"),
    "runtime": Shard(("runtime/distenv", "runtime/slurmlayout"),
                     ("tests/unit/runtime/test_distenv.py", "tests/unit/runtime/test_slurmlayout.py"),
                     "the environment: rank, world, nodes and master from srun, torchrun, mpirun"),
    "devices": Shard(("runtime/devices", "runtime/gpubind"),
                     ("tests/unit/runtime/test_devices.py", "tests/unit/runtime/test_gpubind.py"),
                     "the GPU each rank takes"),
    "jobs": Shard(("jobs/spec", "jobs/slurmvalues", "jobs/interpreter", "jobs/asked"),
                  ("tests/unit/jobs/test_spec.py", "tests/unit/jobs/test_slurmvalues.py",
                   "tests/unit/jobs/test_interpreter.py", "tests/unit/jobs/test_asked.py",
                   "tests/unit/jobs/test_hostile_input.py"),
                  "job specs and their validation"),
    "findings": Shard(("jobs/findings",),
                      ("tests/unit/jobs/test_findings.py", "tests/unit/jobs/test_findings_texts.py",
                       "tests/unit/jobs/test_capacity.py", "tests/unit/jobs/test_interpreter.py"),
                      "job specs Slurm accepts that are likely wrong, each a finding with its hint"),
    "launch": Shard(("runtime/launch", "runtime/runchecks"),
                    ("tests/unit/runtime/test_launch.py", "tests/unit/runtime/test_runchecks.py"),
                    "`torchslurm run`'s plan (exec, srun across the allocation, local ranks) and what it refuses"),
    "sweep": Shard(("jobs/sweep", "jobs/sweepscript"),
                   ("tests/unit/jobs/test_sweep.py", "tests/unit/jobs/test_sweepscript.py"),
                   "a sweep's points, their names and checks, and the job array that runs them"),
    "results": Shard(("jobs/results", "jobs/table", "jobs/sweepstate"),
                     ("tests/unit/jobs/test_results.py", "tests/unit/jobs/test_table.py",
                      "tests/unit/jobs/test_sweepstate.py", "tests/unit/jobs/test_results_texts.py",
                      "tests/unit/jobs/test_sweepstate_texts.py"),
                     "a sweep's state per point and its results table (text, CSV, JSON, Markdown)"),
    "sbatch": Shard(("jobs/sbatch", "jobs/flags"),
                    ("tests/unit/jobs/test_sbatch.py", "tests/unit/jobs/test_flags.py",
                     "tests/unit/jobs/test_hostile_input.py"),
                    "the sbatch script rendered from a spec"),
    "slurmoutput": Shard(("jobs/slurmoutput",),
                         ("tests/unit/jobs/test_slurmoutput.py", "tests/unit/jobs/test_slurm.py"),
                         "what Slurm's commands print, read: squeue, scontrol, sinfo, sbatch, a missing controller"),
    "lint": Shard(("lint/allocation", "lint/batch", "lint/directives", "lint/launch", "lint/launchers", "lint/ports",
                   "lint/rendezvous", "lint/slips", "lint/rule", "lint/report"),
                  ("tests/unit/lint",),
                  "the lint rules and the allocation they judge (parsing, lint/parse and lint/shell, is apart)",
                  reads=("docs",)),
    "lintparse": Shard(("lint/parse", "lint/shell"), ("tests/unit/lint",),
                       "reading a script as bash does: lines, continuations, quoting, heredocs, commands",
                       reads=("docs",)),
    "sandboxconfig": Shard(("sandbox/config",), ("tests/unit/sandbox/test_config.py",),
                           "the sandbox cluster's names, addresses and slurm.conf"),
    "checkpoint": Shard(("train/checkpoint/layout", "train/checkpoint/integrity"),
                        ("tests/unit/train/checkpoint/test_layout.py", "tests/unit/train/checkpoint/test_integrity.py",
                         "tests/unit/train/checkpoint/test_escapes.py", "tests/unit/train/checkpoint/test_reading.py"),
                        "the checkpoint folder protocol and its checksums", forkserver=True),
    "trainconfig": Shard(("train/config", "train/preflight"),
                         ("tests/unit/train/test_config.py", "tests/unit/train/test_preflight.py"),
                         "a run's settings and the checks before any rank trains", forkserver=True),
    "faults": Shard(("train/diagnosis", "train/badnodes", "train/stragglers"),
                    ("tests/unit/train/test_diagnosis.py", "tests/unit/train/test_badnodes.py",
                     "tests/unit/train/test_stragglers.py"),
                    "who is at fault: a failed collective's root cause, the nodes a requeue excludes, stragglers"),
    "train": Shard(("train/requeue", "train/preemption", "train/stopagreement", "train/metrics"),
                   ("tests/unit/train/test_requeue.py", "tests/unit/train/test_preemption.py",
                    "tests/unit/train/test_stopagreement.py", "tests/unit/train/test_metrics.py"),
                   "requeue, preemption and metrics", forkserver=True),
}

CAUGHT = ("killed", "timeout", "caught by type check", "segfault")
"""mutmut's verdicts that count as caught: a test failed, hung past its limit, or the process crashed."""


def module_of(mutant: str) -> str:
    """`torchslurm.hostlist.x_expand__mutmut_3` -> `torchslurm.hostlist` (also `xǁClassǁmethod` names)."""
    parts = mutant.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].startswith(("x_", "xǁ")):
            return ".".join(parts[:i])
    raise ValueError(f"not a mutmut mutant name: {mutant!r}")


def parse_results(text: str) -> dict[str, str]:
    """`mutmut results --all true` output ("    <mutant>: <status>" lines) -> mutant -> status."""
    found = {}
    for line in text.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            found[name] = status
    return found


@dataclass(frozen=True)
class Row:
    module: str
    mutants: int
    caught: int
    survived: int
    equivalent: int
    other: int
    """Neither caught nor survived: no test calls the function, skipped, suspicious, not checked."""

    @property
    def score(self) -> float:
        counted = self.mutants - self.equivalent
        return 100.0 * self.caught / counted if counted else 100.0


def table(results: dict[str, str], equivalent: dict[str, str]) -> list[Row]:
    """Per module (and a total row): mutants, caught, survived (not counting equivalent ones), equivalent."""
    by_module: dict[str, Counter[str]] = {}
    for name, status in results.items():
        counts = by_module.setdefault(module_of(name), Counter())
        counts["mutants"] += 1
        if status in CAUGHT:
            counts["caught"] += 1
        elif status == "survived":
            counts["equivalent" if name in equivalent else "survived"] += 1
        else:
            counts["other"] += 1
    rows = [Row(module, c["mutants"], c["caught"], c["survived"], c["equivalent"], c["other"])
            for module, c in sorted(by_module.items())]
    total = Row("all", *(sum(getattr(r, f) for r in rows) for f in ("mutants", "caught", "survived", "equivalent",
                                                                      "other")))
    return [*rows, total] if rows else []


def render(rows: list[Row]) -> str:
    """A Markdown table."""
    lines = ["| module | mutants | killed | survived | equivalent | other | score |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.module} | {r.mutants} | {r.caught} | {r.survived} | {r.equivalent} | {r.other} | {r.score:.1f} % |"
              for r in rows]
    return "\n".join(lines)


def load_equivalent(path: Path = EQUIVALENT) -> dict[str, str]:
    """mutant name -> why it is equivalent, from every table of the file."""
    if not path.is_file():
        return {}
    data = tomllib.loads(path.read_text())
    return {name: why for section in data.values() for name, why in section.items()}


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def shard_pyproject(text: str, shard: Shard) -> str:
    """The repository's pyproject.toml with its [tool.mutmut] table completed for `shard`."""
    settings = dict(tomllib.loads(text).get("tool", {}).get("mutmut", {}))
    settings["only_mutate"] = [f"src/torchslurm/{module}.py" for module in shard.modules]
    settings["pytest_add_cli_args_test_selection"] = list(shard.tests)
    if shard.forkserver:
        settings["process_isolation"] = "forkserver"
    if shard.reads:
        settings["also_copy"] = list(shard.reads)
    kept, inside = [], False
    for line in text.splitlines():
        if line.startswith("["):
            inside = line.strip() == "[tool.mutmut]"
        if not inside:
            kept.append(line)
    return "\n".join([*kept, "", "[tool.mutmut]", *(f"{k} = {_toml_value(v)}" for k, v in settings.items()), ""])


def prepare(name: str, fresh: bool) -> Path:
    """mutants/<name>/: links to src/, tests/ and what else the tests read, the shard's pyproject.toml (mutmut
    reads it from there)."""
    folder = WORK / name
    if fresh and (folder / "mutants").exists():
        subprocess.run(["rm", "-rf", str(folder / "mutants")], check=True)
    folder.mkdir(parents=True, exist_ok=True)
    for part in ("src", "tests", *SHARDS[name].reads):
        link = folder / part
        if not link.is_symlink():
            link.symlink_to(ROOT / part)
    (folder / "pyproject.toml").write_text(shard_pyproject((ROOT / "pyproject.toml").read_text(), SHARDS[name]))
    return folder


def mutmut(folder: Path, *args: str, log: Path | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # mutmut puts its copy of src/ first
    command = [sys.executable, "-m", "mutmut", *args]
    if log is None:
        return subprocess.run(command, cwd=folder, env=environ, capture_output=True, text=True, check=True)
    with log.open("w") as out:
        return subprocess.run(command, cwd=folder, env=environ, stdout=out, stderr=subprocess.STDOUT, text=True,
                              check=False)


def results(folder: Path) -> dict[str, str]:
    return parse_results(mutmut(folder, "results", "--all", "true").stdout)


def report(name: str, elapsed_s: float | None) -> int:
    folder = WORK / name
    if not (folder / "mutants").is_dir():
        print(f"shard {name} has not run yet: python tools/mutants.py {name}")
        return 1
    found, equivalent = results(folder), load_equivalent()
    rows = table(found, equivalent)
    survivors = sorted(n for n, s in found.items() if s == "survived" and n not in equivalent)
    other = sorted(f"{n}: {s}" for n, s in found.items() if s not in CAUGHT and s != "survived")
    stale = sorted(n for n in equivalent if n.startswith(tuple(f"torchslurm.{m.replace('/', '.')}."
                                                               for m in SHARDS[name].modules))
                   and found.get(n) != "survived")
    lines = [f"## shard {name}: {SHARDS[name].why}", "", render(rows), ""]
    if elapsed_s is not None:
        lines += [f"wall time: {elapsed_s / 60:.1f} min", ""]
    lines += ["survivors (show one with `cd mutants/" + name + " && python -m mutmut show NAME`):",
              *(f"    {n}" for n in survivors), ""]
    kept = sorted(n for n, s in found.items() if s == "survived" and n in equivalent)
    if kept:
        lines += [f"equivalent (why: {EQUIVALENT.relative_to(ROOT)}):", *(f"    {n}" for n in kept), ""]
    if other:
        lines += ["neither caught nor survived:", *(f"    {n}" for n in other), ""]
    if stale:
        lines += [f"listed as equivalent in {EQUIVALENT.relative_to(ROOT)} but no longer surviving (remove them):",
                  *(f"    {n}" for n in stale), ""]
    text = "\n".join(lines)
    print(text)
    (folder / "report.md").write_text(text)
    return 0


def run(name: str, jobs: int, survivors: bool, fresh: bool) -> float:
    folder = prepare(name, fresh)
    log = folder / "run.log"
    print(f"shard {name}: mutating {', '.join(SHARDS[name].modules)}; log in {log.relative_to(ROOT)}", flush=True)
    start = time.monotonic()
    # a plain run tests the mutants of new and changed functions; --survivors then every mutant not caught:
    # the survivors, and those no test called (new tests may call them now). mutmut maps each function to the tests
    # that call it once and then only adds new tests: --survivors has it map them all again, or a function added
    # since would be tried only against the tests added with it.
    if survivors:
        (folder / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    for again in (False, True) if survivors else (False,):
        names = [n for n, s in results(folder).items() if s not in CAUGHT] if again else []
        if again and not names:
            break
        done = mutmut(folder, "run", "--max-children", str(jobs), *names, log=log)
        if done.returncode != 0:
            tail = log.read_text()[-3000:]
            raise SystemExit(f"mutmut run failed for shard {name} (exit code {done.returncode}); the end of "
                             f"{log}:\n{tail}")
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", nargs="*", metavar="SHARD", help=f"one of {', '.join(SHARDS)}, or all")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants tested at once")
    parser.add_argument("--survivors", action="store_true", help="test again only what the last run did not catch")
    parser.add_argument("--fresh", action="store_true", help="forget the shard's earlier results")
    parser.add_argument("--report", action="store_true", help="print the last run's table, run nothing")
    parser.add_argument("--list", action="store_true", help="list the shards")
    args = parser.parse_args(argv)
    if args.list or not args.shards:
        for name, shard in SHARDS.items():
            print(f"{name:11s} {shard.why}\n            mutates: {', '.join(shard.modules)}\n"
                  f"            tests:   {' '.join(shard.tests)}")
        if not args.list:
            print("\nrun one: make mutants SHARD=<name> (or python tools/mutants.py <name>); SHARD=all runs each")
        return 0
    chosen = list(SHARDS) if args.shards == ["all"] else args.shards
    unknown = [name for name in chosen if name not in SHARDS]
    if unknown:
        parser.error(f"unknown shard {', '.join(unknown)}; the shards are {', '.join(SHARDS)} (or all)")
    status = 0
    for name in chosen:
        elapsed = None if args.report else run(name, args.jobs, args.survivors, args.fresh)
        status = max(status, report(name, elapsed))
    return status


if __name__ == "__main__":
    sys.exit(main())

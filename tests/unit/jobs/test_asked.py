"""jobs.asked: what the way a job spec was asked for implies (preemption flags), and every finding about it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchslurm
from torchslurm.jobs import asked as asked_module
from torchslurm.jobs import spec as jobspec
from torchslurm.jobs.asked import (
    Asked,
    bash_syntax,
    findings,
    preemptible_implied,
    preemption_findings,
    preemption_flags,
)
from torchslurm.jobs.spelling import command_line


def asked(given: dict[str, Any], file: dict[str, Any] | None = None, spec_file: Path | None = None) -> Asked:
    file = file or {}
    implied = {"preemptible": True} if preemptible_implied(given, frozenset(file)) else {}
    spec = jobspec.from_mapping({"script": "t.py", **file, **implied, **given})
    return Asked(spec, frozenset(file), command_line(set(given)), given, spec_file)


def test_preemption_flags_are_spelled_as_given() -> None:
    assert preemption_flags({"signal": "USR1", "requeue": False, "nodes": 2}) == ["--signal", "--no-requeue"]


def test_preemption_flags_turn_preemptible_on_only_where_it_is_said_nowhere() -> None:
    assert preemptible_implied({"grace_s": 60}, frozenset())
    assert not preemptible_implied({"grace_s": 60, "preemptible": False}, frozenset())
    assert not preemptible_implied({"grace_s": 60}, frozenset({"preemptible"}))
    assert not preemptible_implied({"nodes": 2}, frozenset())


def test_implied_preemptible_is_said_as_info() -> None:
    (found,) = preemption_findings(asked({"signal": "USR1", "grace_s": 300}))
    assert (found.severity, found.code) == ("info", "preemptible-implied")
    assert found.message == ("--signal, --grace-s turned on --preemptible: the script asks for "
                             "--signal=USR1@300, --requeue and --open-mode=append.")
    assert preemption_findings(asked({"signal": "USR1", "preemptible": True})) == []


def test_preemption_settings_where_preemptible_is_off_are_a_warning_naming_their_source() -> None:
    (found,) = preemption_findings(asked({"requeue": False}, {"preemptible": False, "grace_s": 200},
                                         Path("s.yaml")))
    assert (found.severity, found.code) == ("warning", "preemption-off")
    assert found.message.startswith("grace_s (in s.yaml), --no-requeue take effect only for a preemptible job")
    assert preemption_findings(asked({"preemptible": False})) == []


def test_findings_put_errors_first_and_check_the_flags_after_the_script(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    given = {"script": "t.py", "args": ("--nodes", "4"), "gpus_per_node": 4, "tasks_per_node": 1}
    found = findings(asked(given), None, tmp_path)
    codes = [f.code for f in found]
    assert codes[:2] == ["misplaced-flag", "tasks-vs-gpus"] and found[0].severity == "error"
    assert [f.code for f in findings(asked({"script": "t.py", "args": ()}), None, tmp_path)
            if f.severity != "info"] == []
    assert "script-missing" in [f.code for f in findings(asked({}), None, tmp_path / "elsewhere")]


def test_implied_preemptible_says_how_to_say_so() -> None:
    (found,) = preemption_findings(asked({"signal": "USR1", "requeue": False}))
    assert found.message == ("--signal, --no-requeue turned on --preemptible: the script asks for --signal=USR1@120, "
                             "--no-requeue and --open-mode=append.")
    assert found.hint == (
        "pass --preemptible to say so, or drop --signal, --no-requeue for a job that is not preemptible")


def test_one_preemption_setting_where_preemptible_is_off_takes_effect_only_there() -> None:
    (found,) = preemption_findings(asked({"grace_s": 60, "preemptible": False}))
    assert str(found) == ("warning: [preemption-off] --grace-s takes effect only for a preemptible job, and "
                          "preemptible is off; the script has no #SBATCH --signal or --requeue. HINT: pass "
                          "--preemptible (preemptible: true in the spec file), or drop them")


def test_findings_say_the_flag_after_the_script_and_use_the_slurm_version_and_the_flags_spelling(
        tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    given = {"script": "t.py", "args": ("--time=5",), "gpus_per_node": 2, "gpu_flag": "gres"}
    found = findings(asked(given), "slurm 22.05", tmp_path)
    assert [str(f) for f in found if f.code in ("misplaced-flag", "gpu-flag")] == [
        "error: [misplaced-flag] --time comes after t.py, so t.py gets it and the job spec does not. HINT: put "
        "torchslurm's flags before the script (--time ... t.py ...); if t.py itself takes --time, give --force "
        "before t.py",
        "info: [gpu-flag] --gpu-flag=gres on Slurm 22.05: --gres=gpu:N works, --gpus-per-node also does and sets "
        "SLURM_GPUS_PER_NODE. HINT: keep it, or set --gpu-flag gpus-per-node."]


def test_findings_for_a_script_warn_of_what_submit_refuses_or_makes(tmp_path: Path) -> None:
    """`script` only prints (a missing script is a warning, a missing log folder too); `submit` would wait in the
    queue and fail (an error), and makes the log folders itself."""
    job = asked({"output": "logs/%j.out"})
    printing = {f.code: f.severity for f in findings(job, None, tmp_path)}
    submitting = {f.code: f.severity for f in findings(job, None, tmp_path, submitting=True)}
    assert (printing["script-missing"], printing["log-dir"]) == ("warning", "warning")
    assert submitting["script-missing"] == "error" and "log-dir" not in submitting
    (tmp_path / "logs").mkdir()
    assert "log-dir" not in {f.code for f in findings(job, None, tmp_path)}


def test_findings_run_bash_on_the_rendered_script(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    found = findings(asked({"setup": ("echo )",)}), None, tmp_path)
    assert [f.code for f in found if f.severity == "error"] == ["shell-syntax"]


def test_bash_syntax_says_what_bash_said_in_one_line() -> None:
    assert bash_syntax("#!/bin/bash\necho fine\n") == []
    (found,) = bash_syntax("#!/bin/bash\necho )\n")
    assert (found.severity, found.code) == ("error", "shell-syntax")
    assert found.message == ("the rendered script is not valid bash: bash: line 2: syntax error near unexpected "
                             "token `)' bash: line 2: `echo )'")
    assert found.hint == ("check the setup lines for an unbalanced quote or bracket; `torchslurm script --force ...` "
                          "prints the script anyway")


def test_bash_syntax_reads_the_script_as_the_utf8_it_is_written_in_whatever_the_locale() -> None:
    """A submit from a shell whose locale is not UTF-8 (here: C, with Python's UTF-8 mode off) checks the same
    bytes that go into the script file, and shows bash's words as bash wrote them."""
    script = "#!/bin/bash\necho 'caf\u00e9' )\n"
    (here,) = bash_syntax(script)
    assert here.message.endswith("bash: line 2: `echo 'caf\u00e9' )'")
    package = Path(torchslurm.__file__).parents[1]
    code = (f"from torchslurm.jobs.asked import bash_syntax; (f,) = bash_syntax({script!a}); "
            "print(ascii(f.message))")
    environ = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONPATH": str(package)}
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ascii(here.message)


def test_a_bash_that_hangs_gives_no_finding_after_the_time_limit(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is a courtesy: a stuck `bash -n` (a wedged file system, a broken bash) must not hang the
    submit; sbatch's node says what is wrong with the script instead."""
    stuck = tmp_path / "bash"
    stuck.write_text("#!/bin/sh\nexec sleep 120\n")
    stuck.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(asked_module, "BASH_CHECK_TIMEOUT_S", 0.2)
    assert bash_syntax("#!/bin/bash\necho )\n") == []


def test_bash_syntax_takes_any_text() -> None:
    """A lone surrogate (JobSpec refuses one, bash_syntax may still be handed one) is replaced, not an error."""
    assert bash_syntax("#!/bin/bash\necho '\udcff'\n") == []

"""jobs.asked: what the way a job spec was asked for implies (preemption flags), and every finding about it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchslurm.jobs import spec as jobspec
from torchslurm.jobs.asked import Asked, findings, preemptible_implied, preemption_findings, preemption_flags
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

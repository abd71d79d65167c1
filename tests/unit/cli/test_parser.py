"""The top-level parser: a command line that names its subcommand gets a parser with that subcommand
alone (its modules, not every subcommand's, are imported: `torchslurm run` starts its ranks sooner),
and that parser reads and explains the line exactly as the full one does."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from torchslurm.cli import COMMANDS, build_parser, commands_needed, main


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("argv, needed", [
    (["run", "--nproc", "2", "train.py"], ("run",)),
    (["-v", "run", "train.py"], ("run",)),
    (["--verbose", "train", "epochs=2"], ("train",)),
    (["run", "train", "x"], ("run",)),  # the first name is the command; what follows is its own
    (["--verbose", "-v", "status", "12"], ("status",)),
])
def test_a_named_subcommand_is_the_only_one_needed(argv: list[str], needed: tuple[str, ...]) -> None:
    assert commands_needed(argv) == needed


@pytest.mark.parametrize("argv", [[], ["-v"], ["--help"], ["--help", "run"], ["--version"], ["-h", "train"],
                                  ["frobnicate"], ["ru", "train.py"], ["--verbose", "--version"], ["-x", "run"]])
def test_every_subcommand_where_the_line_names_none_first(argv: list[str]) -> None:
    """Top-level help and errors list every subcommand; an unknown name or option is such an error."""
    assert commands_needed(argv) == COMMANDS


def test_a_parser_built_for_one_subcommand_has_only_it() -> None:
    assert list(_subparsers(build_parser(("run",)))) == ["run"]
    assert list(_subparsers(build_parser())) == list(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_subcommand_alone_reads_and_explains_itself_as_among_all(command: str) -> None:
    alone, among_all = _subparsers(build_parser((command,)))[command], _subparsers(build_parser())[command]
    assert alone.format_help() == among_all.format_help()
    assert alone.prog == among_all.prog == f"torchslurm {command}"


def test_verbose_before_the_subcommand_still_runs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for name in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "ok.py").write_text("print('ok')\n")
    assert main(["-v", "run", "--dry-run", "--nproc", "3", "ok.py"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("local: no launcher found: 3 local rank(s) (--nproc).\n") and out.endswith(" ok.py\n"), out


def test_an_unknown_subcommand_lists_every_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["-v", "frobnicate"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "invalid choice: 'frobnicate' (choose from " + ", ".join(f"'{c}'" for c in COMMANDS) + ")" in err, err

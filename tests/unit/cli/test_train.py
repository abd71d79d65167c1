"""`torchslurm train`'s arguments: the same flags for the command and for each rank."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from torchslurm.cli.train import DEFAULTS, RANK_MODULE, add_arguments, from_arguments


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_sit_between_file_and_key_value(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("epochs: 9\nlr: 0.5\nbatch_size: 8\n")
    args = parse(["--config", str(tmp_path / "c.yaml"), "--epochs", "2", "--checkpoint-dir", "ck",
                  "--lr", "0.2", "lr=0.3"])
    _, cfg = from_arguments(args, {"seed": 5})
    assert (cfg.epochs, cfg.lr, cfg.batch_size, cfg.run_dir, cfg.seed) == (2, 0.3, 8, Path("ck"), 5)


def test_without_settings_the_demo_defaults_apply() -> None:
    example, cfg = from_arguments(parse([]))
    assert (cfg.epochs, cfg.batch_size, cfg.lr, str(cfg.run_dir)) == (
        DEFAULTS["epochs"], DEFAULTS["batch_size"], DEFAULTS["lr"], DEFAULTS["run_dir"])
    assert (example.dataset, example.resolved_model) == ("digits", "convnet")


def test_the_rank_program_is_this_module() -> None:
    """Ranks start as `python -m RANK_MODULE`: it must name the module that holds rank_main."""
    import importlib

    assert hasattr(importlib.import_module(RANK_MODULE), "rank_main")


def test_dry_run_shows_every_setting_that_changes_the_result(capsys: pytest.CaptureFixture[str]) -> None:
    from torchslurm.cli import main

    assert main(["train", "--dry-run", "--nproc", "1", "amp=bf16", "lr_scaling=linear", "grad_clip=1e-1",
                 "seed=010"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "lr_scaling=linear amp=bf16 grad_clip=0.1 seed=10 " in first, first


def test_a_rank_whose_checkpoint_cannot_be_written_exits_1_not_2(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """2 says "your settings"; a full disk is a run that failed."""
    import errno

    from torchslurm.cli import train
    from torchslurm.train.checkpoint.durability import save_failed

    def full_disk(args: argparse.Namespace) -> None:
        raise save_failed(3, OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(train, "from_arguments", full_disk)
    assert train.rank_main([]) == 1
    assert "error: the checkpoint of step 3 could not be written to disk (it is full)" in capsys.readouterr().err
    monkeypatch.setattr(train, "from_arguments", lambda args: from_arguments(parse(["epochs=0"])))
    assert train.rank_main([]) == 2  # a setting refused: the usage code, as before


def test_settings_go_anywhere_on_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    """key=value before, between and after the flags; the later of two wins, as on one line."""
    from torchslurm.cli import main

    assert main(["train", "dataset=text", "epochs=9", "--nproc", "2", "epochs=4", "--dry-run", "seed=3"]) == 0
    first, _, launch = capsys.readouterr().out.splitlines()
    assert "dataset=text model=gpt " in first and " epochs=4 " in first and " seed=3 " in first, first
    assert launch.endswith("-m torchslurm.cli.train dataset=text epochs=9 epochs=4 seed=3"), launch


def test_an_unknown_key_after_a_flag_and_an_unknown_flag_get_did_you_mean(
        capsys: pytest.CaptureFixture[str]) -> None:
    from torchslurm.cli import main

    assert main(["train", "--nproc", "2", "--dry-run", "epoch=4"]) == 2
    assert "unknown key(s) in key=value: epoch. HINT: did you mean epoch -> epochs?" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["train", "dataset=text", "--nproc", "2", "--epoch", "4", "lr=0.1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(  # the setting is not among the unknown
        "error: torchslurm train: unrecognized arguments: --epoch 4. HINT: did you mean --epoch -> --epochs? "
        "`torchslurm train --help` lists the options.")


def test_a_rank_reads_settings_anywhere_too() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    _, cfg = from_arguments(parser.parse_intermixed_args(["lr=0.2", "--epochs", "3", "batch_size=8"]))
    assert (cfg.lr, cfg.epochs, cfg.batch_size) == (0.2, 3, 8)

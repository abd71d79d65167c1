"""The CLI's own errors for bad flags: one line naming the subcommand and the HINT, no usage dump."""

from __future__ import annotations

import pytest

from torchslurm.cli import main


@pytest.mark.parametrize("argv, expected", [
    (["script", "--gpus-per-node", "abc", "t.py"],
     "error: torchslurm script: argument --gpus-per-node: invalid int value: 'abc'. "
     "HINT: `torchslurm script --help` lists the options."),
    (["script", "--bogus", "1"],
     "error: torchslurm script: unrecognized arguments: --bogus. "
     "HINT: `torchslurm script --help` lists the options."),
    (["status", "1", "2"],
     "error: torchslurm status: unrecognized arguments: 2. HINT: `torchslurm status --help` lists the options."),
    (["frobnicate"], "error: torchslurm: argument COMMAND: invalid choice: 'frobnicate' (choose from 'run', "),
])
def test_a_bad_flag_is_one_line_with_the_subcommands_help_as_hint(argv: list[str], expected: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.startswith(expected) and "usage:" not in err, err

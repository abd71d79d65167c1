"""train.preflight: run_dir is tried for real (mkdir and a probe file), not judged by permission bits; the
optimizer must hold the model's parameters; the datasets must be map-style, the training data not empty."""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset

from torchslurm.errors import ConfigError
from torchslurm.train import preflight
from torchslurm.train.config import TrainConfig
from torchslurm.train.preflight import data_problem, optimizer_problem, run_dir_problem
from torchslurm.train.trainer import Trainer


def test_a_writable_run_dir_passes_and_only_keep_created_leaves_it(tmp_path: Path) -> None:
    assert run_dir_problem(tmp_path / "x" / "y") is None
    assert not (tmp_path / "x").exists()
    assert run_dir_problem(tmp_path / "x" / "y", keep_created=True) is None
    assert (tmp_path / "x" / "y").is_dir() and list((tmp_path / "x" / "y").iterdir()) == []


def test_proc_and_a_path_under_a_file_are_refused_with_the_fix(tmp_path: Path) -> None:
    proc = run_dir_problem(Path("/proc/foo"))
    assert proc is not None and proc.message.startswith("run_dir=/proc/foo cannot be created (")
    assert proc.hint is not None and "run_dir=$HOME/runs/demo" in proc.hint
    (tmp_path / "file").write_text("")
    under = run_dir_problem(tmp_path / "file" / "sub")
    assert under is not None and f"is inside {tmp_path / 'file'}, which is a file" in under.message


def test_the_write_probe_never_follows_a_link_planted_under_its_name(tmp_path: Path) -> None:
    import os
    import socket

    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    planted = run_dir / f".torchslurm-write-test-{socket.gethostname()}-{os.getpid()}"
    planted.symlink_to(precious)  # the name is predictable: another user may put a link there first
    assert run_dir_problem(run_dir) is None
    assert precious.read_text() == "keep me"
    assert list(run_dir.iterdir()) == []


def test_an_optimizer_on_another_modules_parameters_is_refused_when_the_trainer_is_built() -> None:
    model, other = nn.Linear(3, 2), nn.Linear(3, 2)
    assert optimizer_problem(model, torch.optim.SGD(model.parameters(), lr=0.1)) is None
    assert optimizer_problem(model, torch.optim.SGD([model.weight], lr=0.1)) is None  # a part (a frozen bias)
    problem = optimizer_problem(model, torch.optim.SGD(other.parameters(), lr=0.1))
    assert problem is not None and problem.message == (
        "the optimizer holds 2 parameter tensor(s) and none of them is among the parameters of the model given to the "
        "Trainer (Linear, 2 parameter tensor(s)).")
    assert problem.hint is not None and "torch.optim.AdamW(model.parameters())" in problem.hint
    temperature = nn.Parameter(torch.ones(()))
    mixed = optimizer_problem(model, torch.optim.SGD([*model.parameters(), temperature], lr=0.1))
    assert mixed is not None and "3 parameter tensor(s) and 1 of them is not among" in mixed.message


class _Stream(IterableDataset[int]):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(4))


def test_datasets_must_be_map_style_and_the_training_data_not_empty() -> None:
    data = TensorDataset(torch.zeros(4, 2), torch.zeros(4))
    assert data_problem(data, data) is None and data_problem([(1, 2)], None) is None  # None: no validation
    for train, val, expected in ((None, data, "train_data is None; expected a map-style Dataset (len() and [i])"),
                                 (_Stream(), data, "train_data (_Stream) has no len(); expected a map-style"),
                                 (data, _Stream(), "val_data (_Stream) has no len(); expected a map-style"),
                                 (data, 7, "val_data (int) has no len() and no [i]; expected"),
                                 (TensorDataset(torch.zeros(0, 2)), data,
                                  "train_data (TensorDataset) holds no samples; expected at least one.")):
        problem = data_problem(train, val)
        assert problem is not None and problem.message.startswith(expected), (expected, problem)
        assert problem.hint


def _trainer(tmp_path: Path, train: object, val: object, resume: str = "auto") -> Trainer:
    model = nn.Linear(2, 2)
    config = TrainConfig(epochs=2, batch_size=4, lr=0.1, run_dir=tmp_path / "run", log_every=0, resume=resume)
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.cross_entropy,
                   train, val, config, environ={})  # type: ignore[arg-type]


def test_the_trainer_refuses_empty_training_data_and_trains_without_validation_data(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match=r"train_data \(TensorDataset\) holds no samples.*HINT: check how it is"):
        _trainer(tmp_path, TensorDataset(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long)), None)
    data = TensorDataset(torch.randn(8, 2), torch.tensor([0, 1] * 4))
    with caplog.at_level(logging.INFO, logger="torchslurm"):
        result = _trainer(tmp_path, data, None).fit()
    assert (result.exit_code, result.epochs_done, result.global_step, result.val.count) == (0, 2, 4, 0)
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("Epoch")] == \
        ["Epoch 1 - no validation data", "Epoch 2 - no validation data"]


def test_the_trainer_refuses_a_resume_that_names_no_checkpoint_before_it_starts(tmp_path: Path) -> None:
    """As `torchslurm train` does before any rank starts; a TrainConfig of one's own used to meet it only in
    fit(), as a CheckpointError about a missing state.pt."""
    data = TensorDataset(torch.randn(8, 2), torch.tensor([0, 1] * 4))
    with pytest.raises(ConfigError, match=r"resume='sometimes': no such folder; expected auto, never or a checkpoint "
                                          r"folder .*HINT: resume=auto continues"):
        _trainer(tmp_path, data, data, resume="sometimes")


WRITE_THERE = "checkpoints/ and metrics.jsonl are written there."
CHOOSE = ("choose a directory you can write to, on a filesystem every node sees, e.g. run_dir=$HOME/runs/demo.")
A_DIRECTORY = ("expected a directory for checkpoints/ and metrics.jsonl.",
               "point run_dir at a directory (it is created if missing), e.g. run_dir=runs/demo.")


def _whole(problem: ConfigError | None) -> tuple[str, str | None]:
    assert problem is not None
    return problem.message, problem.hint


def test_a_run_dir_that_is_or_lies_under_a_file_is_refused_whole(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    assert _whole(run_dir_problem(file)) == (f"run_dir={file} is an existing file; {A_DIRECTORY[0]}", A_DIRECTORY[1])
    assert _whole(run_dir_problem(file / "a" / "b")) == (
        f"run_dir={file}/a/b is inside {file}, which is a file; {A_DIRECTORY[0]}", A_DIRECTORY[1])
    assert _whole(run_dir_problem(Path("/proc/foo"))) == (
        f"run_dir=/proc/foo cannot be created (No such file or directory: /proc/foo); {WRITE_THERE}", CHOOSE)


def _failing_probe(monkeypatch: pytest.MonkeyPatch, error: OSError) -> list[Path]:
    tried: list[Path] = []

    def open_new(path: Path, mode: str) -> None:
        tried.append(path)
        raise error

    monkeypatch.setattr(preflight, "open_new", open_new)
    return tried


def test_a_run_dir_that_cannot_be_written_is_refused_whole_and_what_was_created_is_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_probe(monkeypatch, OSError(errno.EROFS, "Read-only file system", "/mnt/ro/probe"))
    assert _whole(run_dir_problem(tmp_path)) == (
        f"run_dir={tmp_path} is not writable (Read-only file system: /mnt/ro/probe); {WRITE_THERE}", CHOOSE)
    assert _whole(run_dir_problem(tmp_path / "a" / "b")) == (
        f"run_dir={tmp_path}/a/b cannot be created (Read-only file system: /mnt/ro/probe); {WRITE_THERE}", CHOOSE)
    assert list(tmp_path.iterdir()) == []
    _failing_probe(monkeypatch, OSError("no reason given"))  # an OSError without strerror or filename
    assert _whole(run_dir_problem(tmp_path / "a" / "b", keep_created=True)) == (
        f"run_dir={tmp_path}/a/b cannot be created (no reason given: {tmp_path}/a/b); {WRITE_THERE}", CHOOSE)
    assert (tmp_path / "a" / "b").is_dir()


def test_only_the_folders_made_for_the_test_are_removed(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    assert run_dir_problem(tmp_path / "a" / "b" / "c") is None
    assert [p.name for p in tmp_path.iterdir()] == ["a"] and list((tmp_path / "a").iterdir()) == []


def test_the_probe_is_tried_twice_then_its_error_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = tmp_path / f".torchslurm-write-test-{socket.gethostname()}-{os.getpid()}"
    probe.write_text("")  # left by a crash: removed, and the probe made again once
    tried = _failing_probe(monkeypatch, FileExistsError(errno.EEXIST, "File exists", str(probe)))
    assert _whole(run_dir_problem(tmp_path)) == (
        f"run_dir={tmp_path} is not writable (File exists: {probe}); {WRITE_THERE}", CHOOSE)
    assert tried == [probe, probe]


def test_every_refusal_of_an_optimizer_is_said_whole() -> None:
    model, other = nn.Linear(3, 2), nn.Linear(3, 2)
    hint = ("build the optimizer from that model's parameters, e.g. torch.optim.AdamW(model.parameters()); a learnable "
            "value outside it (a loss weight) belongs in an nn.Module inside the model.")
    given = "among the parameters of the model given to the Trainer (Linear, 2 parameter tensor(s))."
    for params, what in (([*other.parameters()], "2 parameter tensor(s) and none of them is"),
                         ([model.weight, other.bias], "2 parameter tensor(s) and 1 of them is not"),
                         ([model.weight, *other.parameters()], "3 parameter tensor(s) and 2 of them are not")):
        assert _whole(optimizer_problem(model, torch.optim.SGD(params, lr=0.1))) == (
            f"the optimizer holds {what} {given}", hint)
    two_groups = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.01}], lr=0.1)
    assert optimizer_problem(model, two_groups) is None


MAP_STYLE = ("expected a map-style Dataset (len() and [i]): each rank reads its own share of its indices.",
             "pass a torch.utils.data.Dataset with __len__ and __getitem__ (a list of samples works too); an "
             "IterableDataset has no indices to share out: keep its samples in a list, or index your files.")


class _NoItems:
    def __len__(self) -> int:
        return 3


def test_every_refusal_of_the_datasets_is_said_whole() -> None:
    data = [(0, 1), (1, 0)]
    for train, val, given in ((None, data, "train_data is None"), (data, 7, "val_data (int) has no len() and no [i]"),
                              (_Stream(), None, "train_data (_Stream) has no len()"),
                              (_NoItems(), None, "train_data (_NoItems) has no [i]")):
        assert _whole(data_problem(train, val)) == (f"{given}; {MAP_STYLE[0]}", MAP_STYLE[1])
    assert data_problem(data, {}) is None  # a dict has len() and [i]
    assert _whole(data_problem([], data)) == (
        "train_data (list) holds no samples; expected at least one.",
        "check how it is built: a data path or a filter that matched nothing is the usual cause.")
    assert data_problem([(0, 1)], []) is None  # empty validation data: nothing to validate, not an error

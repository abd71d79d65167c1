"""checkpoint.durability: a checkpoint's files fsynced on a thread, and the one message of a save that
failed on the file system (the writer's paths through them: test_writer.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from torchslurm.errors import CheckpointError
from torchslurm.exitcodes import FAILED_EXIT_CODE
from torchslurm.train.checkpoint import durability
from torchslurm.train.checkpoint.durability import Durability, disk_failure, save_failed

FULL_HINT = ("free space (or quota) on run_dir's file system; the checkpoints saved before are kept, and "
             "resume=auto continues from the newest.")
OTHER_HINT = ("check free space, permissions and the health of run_dir's file system; the checkpoints saved "
              "before are kept, and resume=auto continues from the newest.")


def raised_while(cause: BaseException) -> RuntimeError:
    """What torch.save raises when a write fails: a RuntimeError about the stream, raised while
    handling the OSError that says what happened."""
    try:
        try:
            raise cause
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:858] . PytorchStreamWriter failed") from None
    except RuntimeError as exc:
        return exc


def test_only_a_file_system_failure_is_reported_as_a_checkpoint_not_written() -> None:
    """A collective that fails mid-save (a peer killed while saving) must reach the watchdog as it is:
    as "could not be written to disk" it would end the rank without the diagnosis and the requeue."""
    assert disk_failure(raised_while(OSError(errno.ENOSPC, "No space left on device")))
    assert disk_failure(OSError(errno.EIO, "Input/output error"))
    assert disk_failure(CheckpointError("said before", "hint"))
    assert not disk_failure(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [198.18.0.12]"))


@pytest.mark.parametrize(("error", "text", "hint"), [
    (OSError(errno.ENOSPC, "No space left on device"),
     "the checkpoint of step 7 could not be written to disk (it is full): OSError: [Errno 28] No space left on "
     "device.", FULL_HINT),
    (raised_while(OSError(errno.EDQUOT, "Disk quota exceeded")),
     "the checkpoint of step 7 could not be written to disk (it is full): OSError: [Errno 122] Disk quota "
     "exceeded.", FULL_HINT),
    (OSError(errno.EIO, "Input/output error"),
     "the checkpoint of step 7 could not be written to disk: OSError: [Errno 5] Input/output error.", OTHER_HINT),
    (RuntimeError("stream failed"),
     "the checkpoint of step 7 could not be written to disk: RuntimeError: stream failed.", OTHER_HINT),
])
def test_a_failed_save_is_one_message_naming_a_full_disk(error: BaseException, text: str, hint: str) -> None:
    failed = save_failed(7, error)
    assert (failed.message, failed.hint, failed.exit_code) == (text, hint, FAILED_EXIT_CODE)


def test_a_message_already_said_is_kept_and_the_cause_is_looked_for_eight_deep() -> None:
    said = CheckpointError("the checkpoint of step 3 could not be written to disk: ...", "hint")
    assert save_failed(9, said) is said
    deep: BaseException = OSError(errno.ENOSPC, "No space left on device")
    for depth in range(9):
        outer = RuntimeError(f"wrapped {depth + 1}")
        outer.__cause__ = deep
        deep = outer
        if depth == 6:  # the OSError is the eighth link of the chain: still found
            assert save_failed(1, deep).message.endswith("(it is full): OSError: [Errno 28] No space left on device.")
    assert save_failed(1, deep).message.endswith("to disk: RuntimeError: wrapped 9.")  # nine deep: not followed


def test_the_thread_fsyncs_the_held_files_and_the_renamed_paths_after_the_early_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.startswith(str(tmp_path)):  # a thread another test left running syncs its own files
            order.append(path)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    mine = (tmp_path, tmp_path.parent)
    monkeypatch.setattr(durability, "fsync", lambda path: order.append(f"path {path}") if path in mine else None)

    class Writeback:
        def join(self) -> None:
            order.append("writeback joined")

    files = [tmp_path / "a.pt", tmp_path / "b.pt"]
    for file in files:
        file.write_bytes(b"x")
    durable = Durability(step=5)
    durable.writeback = Writeback()  # type: ignore[assignment]
    for file in files:
        durable.hold(file)
    durable.after_rename(tmp_path, tmp_path.parent)
    durable.start()
    durable.join()
    assert order == ["writeback joined", *map(str, files), f"path {tmp_path}", f"path {tmp_path.parent}"]
    assert not held_open(files)


def test_a_failed_fsync_is_raised_by_join_and_the_files_are_closed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fd: int) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    (tmp_path / "a.pt").write_bytes(b"x")
    monkeypatch.setattr(os, "fsync", failing)
    durable = Durability(step=12)
    durable.hold(tmp_path / "a.pt")
    durable.start()
    with pytest.raises(CheckpointError) as info:
        durable.join()
    assert info.value.message == ("the checkpoint of step 12 could not be written to disk: OSError: [Errno 5] "
                                  "Input/output error.")
    assert isinstance(info.value.__cause__, OSError)
    assert not held_open([tmp_path / "a.pt"])
    Durability(step=1).join()  # never started: nothing to wait for


def held_open(files: list[Path]) -> list[str]:
    names = {str(f) for f in files}
    return [target for fd in os.listdir("/proc/self/fd") if (target := _target(fd)) in names]


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""

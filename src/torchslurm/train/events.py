"""TensorBoard event files beside metrics.jsonl, so that `tensorboard --logdir RUN_DIR` shows a run.

Written directly in TensorBoard's file format (TFRecord frames of `Event` protocol buffers) rather
than through `torch.utils.tensorboard`: that import takes 1-3 s of rank 0's start-up, during which
every other rank waits at its first collective, while a scalar event is a few dozen bytes. Only
the fields TensorBoard reads for scalars are written: wall_time, step, file_version,
summary.value{tag, simple_value} and session_log.status.

Resuming re-does the steps after the checkpoint; `purge(step)` writes the SessionLog START that
tells TensorBoard to drop the earlier files' events from that step on, as `MetricsLog.keep_until`
drops the records of metrics.jsonl.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from torchslurm.runtime.safefiles import open_append

_NOT_SCALARS = frozenset({"kind", "epoch", "step"})


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # Castagnoli, reflected
        table.append(crc)
    return tuple(table)


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def frame(payload: bytes) -> bytes:
    """One TFRecord: length, its masked CRC-32C, the payload, the payload's masked CRC-32C."""
    length = struct.pack("<Q", len(payload))
    return length + _masked(length) + payload + _masked(payload)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _message(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def event(wall_time: float, step: int = 0, *, version: str | None = None,
          scalars: Mapping[str, float] | None = None, session_start: bool = False) -> bytes:
    """An `Event` message (tensorboard's event.proto field numbers)."""
    out = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(max(step, 0))
    if version is not None:
        out += _message(3, version.encode())
    if scalars:
        values = b"".join(_message(1, _message(1, tag.encode()) + _field(2, 5) + struct.pack("<f", value))
                          for tag, value in scalars.items())
        out += _message(5, values)
    if session_start:
        out += _message(7, _field(1, 0) + _varint(1))  # session_log = SessionLog{status: START}
    return out


def scalars_of(record: Mapping[str, Any]) -> dict[str, float]:
    """metrics.jsonl's numbers as TensorBoard tags: `epoch/val_loss`, `step/loss`, ..."""
    kind = str(record.get("kind", "metrics"))
    return {f"{kind}/{key}": float(value) for key, value in record.items()
            if key not in _NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool)}


class EventWriter:
    """Appends scalar events to one new `events.out.tfevents.*` file in `log_dir`, opened on first
    use and flushed per record (a record is written at most once per logged step)."""

    def __init__(self, log_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.log_dir, self._clock = Path(log_dir), clock
        self._file: IO[bytes] | None = None

    def write(self, record: Mapping[str, Any]) -> None:
        values = scalars_of(record)
        if values:
            self._append(event(self._clock(), int(record.get("step", 0)), scalars=values))

    def purge(self, step: int) -> None:
        """TensorBoard drops the events of earlier files whose step is `step` or later."""
        self._append(event(self._clock(), step, session_start=True))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _append(self, payload: bytes) -> None:
        if self._file is None:
            self._file = self._open()
        self._file.write(frame(payload))
        self._file.flush()

    def _open(self) -> IO[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        now = self._clock()
        # TensorBoard reads files whose name contains "tfevents", in name order: the time first
        name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.torchslurm"
        handle = open_append(self.log_dir / name, "ab")  # open for the writer's lifetime
        handle.write(frame(event(now, version="brain.Event:2")))
        return handle

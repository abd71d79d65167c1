"""torch.distributed and torch.cuda as one rank of a group of two sees them, played in this process: what
the agreement to stop sends, waits for and copies (test_stopagreement.py, test_preemption.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch


class Peers:
    """torch.distributed as this rank sees a group of two: its all_reduce(MAX) merges the peer's flags. `log`
    says each all_reduce and each wait for one, in order."""

    ReduceOp = torch.distributed.ReduceOp

    def __init__(self, rank: int, peer: list[int], backend: str = "gloo") -> None:
        self.rank, self.peer, self.backend = rank, peer, backend
        self.reduced: list[tuple[list[int], object, bool, torch.dtype, str]] = []
        self.tensors: list[torch.Tensor] = []
        self.log: list[str] = []
        self.waits = self.barriers = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in ("is_available", "is_initialized", "get_world_size", "get_rank", "get_backend", "all_reduce",
                     "barrier"):
            monkeypatch.setattr(torch.distributed, name, getattr(self, name))

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self) -> int:
        return 2

    def get_rank(self) -> int:
        return self.rank

    def get_backend(self) -> str:
        return self.backend

    def barrier(self) -> None:
        self.barriers += 1

    def all_reduce(self, tensor: torch.Tensor, op: object = None, async_op: bool = False) -> Any:
        self.reduced.append((tensor.tolist(), op, async_op, tensor.dtype, tensor.device.type))
        self.tensors.append(tensor)
        self.log.append("all_reduce")
        tensor[:] = torch.maximum(tensor, torch.tensor(self.peer, dtype=tensor.dtype))
        peers = self

        class Work:
            def wait(self) -> None:
                peers.waits += 1
                peers.log.append("wait for the all_reduce")

        return Work()


class Cuda:
    """What an NCCL rank asks of torch.cuda, played on the CPU: where each tensor lives (pageable memory,
    pinned memory or device 3), and every copy and event, said in `log` in order."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self._placed: dict[int, tuple[torch.Tensor, str]] = {}

    def where(self, tensor: torch.Tensor) -> str:
        placed = self._placed.get(id(tensor))
        return placed[1] if placed is not None and placed[0] is tensor else "pageable"

    def _place(self, tensor: torch.Tensor, where: str) -> torch.Tensor:
        self._placed[id(tensor)] = (tensor, where)
        return tensor

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        empty, copy, log = torch.empty, torch.Tensor.copy_, self.log

        def to(tensor: torch.Tensor, device: object = None, non_blocking: object = False) -> torch.Tensor:
            log.append(f"{self.where(tensor)} -> device {device}, non_blocking={non_blocking}")
            return self._place(tensor.clone(), f"device {device}")

        def copy_(tensor: torch.Tensor, src: torch.Tensor, non_blocking: object = False) -> torch.Tensor:
            log.append(f"{self.where(src)} -> {self.where(tensor)}, non_blocking={non_blocking}")
            return copy(tensor, src)

        def empty_maybe_pinned(*size: Any, pin_memory: object = False, **kw: Any) -> torch.Tensor:
            return self._place(empty(*size, **kw), "pinned" if pin_memory else "pageable")

        class Event:
            def record(self) -> None:
                log.append("event recorded")

            def synchronize(self) -> None:
                log.append("the host waits for the event")

        monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch, "empty", empty_maybe_pinned)
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor: self._place(tensor.clone(), "pinned"))
        monkeypatch.setattr(torch.Tensor, "to", to)
        monkeypatch.setattr(torch.Tensor, "copy_", copy_)

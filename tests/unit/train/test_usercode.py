"""An exception of the user's code is told as theirs (rank, their file:line, the exception); torchslurm's
own errors, failed collectives and device errors pass unchanged."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from torchslurm.errors import ConfigError, UserCodeError
from torchslurm.train.usercode import culprit, from_collective, user_code

HERE = Path(__file__).resolve()


def _users_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target[:3]).pow(2).mean()  # the bug: a target of another shape


def test_a_shape_bug_in_the_users_loss_names_the_rank_their_line_and_the_exception() -> None:
    with pytest.raises(UserCodeError) as caught, user_code(rank=3, what="loss_fn"):
        _users_loss(torch.ones(8, 2), torch.ones(8, 2))
    line = _users_loss.__code__.co_firstlineno + 1
    assert caught.value.message == (
        f"rank 3: loss_fn raised RuntimeError at {HERE}:{line} (in _users_loss): The size of tensor a (8) must "
        "match the size of tensor b (3) at non-singleton dimension 0")
    assert caught.value.hint and "not a distributed failure" in caught.value.hint
    assert caught.value.exit_code == 1 and isinstance(caught.value.__cause__, RuntimeError)
    assert not isinstance(caught.value, RuntimeError)  # the watchdog reads RuntimeErrors as failed collectives


def test_errors_that_are_not_the_users_pass_unchanged() -> None:
    with pytest.raises(ConfigError, match="ours"), user_code(0, "the step function"):
        raise ConfigError("ours", "framed already")
    with pytest.raises(dist.DistBackendError), user_code(0, "the model's forward"):
        raise dist.DistBackendError("Connection closed by peer [198.18.0.12]:41234")
    with pytest.raises(RuntimeError, match="CUDA error: an illegal memory access"), user_code(0, "loss_fn"):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(KeyboardInterrupt), user_code(0, "loss_fn"):
        raise KeyboardInterrupt


def test_a_collective_is_recognised_by_where_it_failed() -> None:
    frames = traceback.StackSummary.from_list([
        ("/home/me/train.py", 10, "main", "trainer.fit()"),
        ("/venv/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 200, "foreach_all_gather", "work.wait()"),
    ])
    error = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    try:
        raise error
    except RuntimeError as exc:
        assert not from_collective(exc)  # raised right here, in a test file
    assert culprit(frames, ("/venv/torch",)) == frames[0]
    assert culprit(frames[1:], ("/venv/torch",)) == frames[1]  # no frame of the user's: torch's deepest

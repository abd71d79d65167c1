"""Each strategy's quirks, in a one-rank Gloo group: DDP's settling and no_sync, FSDP's gradient sync
and evaluation padding, and the one place a configured name becomes a strategy."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from torchslurm.errors import ConfigError
from torchslurm.train.config import TrainConfig, device_problem
from torchslurm.train.strategy import DDP, FSDP, Strategy, make_scaler, make_strategy, restore_scaler
from torchslurm.train.topology import Topology

ALONE = Topology(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo", num_nodes=1,
                 local_world_size=1, master="local")


def _parts() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_one_process_without_a_process_group_trains_the_model_as_it_is_whatever_the_setting() -> None:
    model, optimizer = _parts()
    for name in ("ddp", "fsdp"):
        alone = make_strategy(model, optimizer, TrainConfig(strategy=name), ALONE)
        assert type(alone) is Strategy and alone.train_module is alone.eval_module is model
        assert alone.state_form == "replicated"


def test_one_rank_in_a_process_group_shards_under_fsdp_and_trains_plainly_under_ddp(one_rank_group: None) -> None:
    model, optimizer = _parts()
    plain = make_strategy(model, optimizer, TrainConfig(strategy="ddp"), ALONE)
    assert type(plain) is Strategy and plain.train_module is model
    model, optimizer = _parts()
    sharded = make_strategy(model, optimizer, TrainConfig(strategy="fsdp"), ALONE)
    assert isinstance(sharded, FSDP) and sharded.state_form == "sharded"


def test_the_configured_name_picks_the_class(one_rank_group: None) -> None:
    two = replace(ALONE, world_size=2)  # the name is read only when there are several ranks
    model, optimizer = _parts()
    assert isinstance(make_strategy(model, optimizer, TrainConfig(strategy="ddp"), two), DDP)
    model, optimizer = _parts()
    sharded = make_strategy(model, optimizer, TrainConfig(strategy="fsdp"), two)
    assert isinstance(sharded, FSDP) and sharded.state_form == "sharded"


def test_ddp_settles_its_buckets_and_puts_the_model_back(one_rank_group: None) -> None:
    model, optimizer = _parts()
    ddp = DDP(model, ALONE)
    assert isinstance(ddp.train_module, DistributedDataParallel) and ddp.eval_module is model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ran: list[bool] = []

    def backward_once() -> None:
        ran.append(True)
        ddp.train_module(torch.ones(2, 4)).sum().backward()
        with torch.no_grad():
            model[0].weight.add_(1.0)  # whatever the throw-away step did to the weights is undone

    ddp.settle(backward_once, optimizer)
    assert ran == [True] and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_ddp_synchronises_gradients_only_on_the_boundary(one_rank_group: None) -> None:
    ddp = DDP(_parts()[0], ALONE)
    module = ddp.train_module
    assert isinstance(module, DistributedDataParallel)
    with ddp.accumulate(boundary=False):
        assert not module.require_backward_grad_sync
    with ddp.accumulate(boundary=True):
        assert module.require_backward_grad_sync


def test_fsdp_turns_gradient_sync_off_between_boundaries(one_rank_group: None) -> None:
    model, optimizer = _parts()
    sharded = FSDP(model, optimizer, TrainConfig(strategy="fsdp"), ALONE)
    assert sharded.train_module is model
    states = [group.reduce_grads for group in _param_groups(model)]
    assert all(states)
    with sharded.accumulate(boundary=False):
        assert not any(group.reduce_grads for group in _param_groups(model))
    assert all(group.reduce_grads for group in _param_groups(model))


def _param_groups(model: nn.Module) -> list:  # type: ignore[type-arg]
    return [m._get_fsdp_state()._fsdp_param_group for m in model.modules()  # type: ignore[operator]
            if hasattr(m, "_get_fsdp_state") and m._get_fsdp_state()._fsdp_param_group is not None]


@pytest.mark.parametrize("samples, batches_run, padded", [(10, 3, 0), (10, 2, 1), (7, 1, 1)])
def test_fsdp_pads_evaluation_to_the_first_ranks_forward_passes(one_rank_group: None, samples: int,
                                                                 batches_run: int, padded: int) -> None:
    model, optimizer = _parts()
    two = replace(ALONE, world_size=2)  # this rank's share of 2: ceil(samples / 2) samples, batches of 2
    sharded = FSDP(model, optimizer, TrainConfig(strategy="fsdp"), two)
    calls: list[int] = []
    model.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[0]))
    data = TensorDataset(torch.ones(samples, 4), torch.zeros(samples, dtype=torch.long))
    sharded.pad_evaluation(data, batches_run, batch_size=2, forward_one=lambda: model(data[:1][0]))
    assert calls == [1] * padded


def test_the_fp16_rule_is_stated_once() -> None:
    assert device_problem(TrainConfig(amp="fp16"), "cuda") is None
    assert device_problem(TrainConfig(amp="bf16"), "cpu") is None
    problem = device_problem(TrainConfig(amp="fp16"), "cpu")
    assert isinstance(problem, ConfigError) and problem.message.startswith("amp=fp16 needs CUDA")


SAVED_SCALER = {"scale": 2.0**13, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                "_growth_tracker": 3}
"""An fp16 scaler's state after a few steps: the scale lowered and growth counted since."""


def test_an_fp16_checkpoint_s_scaler_state_is_restored_scale_and_growth_tracker() -> None:
    scaler = make_scaler("fp16", "cpu")
    assert restore_scaler(scaler, dict(SAVED_SCALER))
    assert scaler.state_dict() == SAVED_SCALER and scaler.get_scale() == 2.0**13


def test_an_fp16_run_resumed_from_a_checkpoint_without_amp_fp16_starts_a_fresh_scale(
        caplog: pytest.LogCaptureFixture) -> None:
    scaler = make_scaler("fp16", "cpu")  # torch's own load_state_dict raises on the empty state
    with caplog.at_level(logging.INFO, logger="torchslurm.train.strategy"):
        assert not restore_scaler(scaler, {})
    assert scaler.get_scale() == 2.0**16
    assert caplog.messages == ["the checkpoint has no GradScaler state (it was saved without amp=fp16): the loss "
                               "scale starts afresh at 65536"]


def test_a_run_without_amp_fp16_ignores_a_checkpoint_s_scaler_state(caplog: pytest.LogCaptureFixture) -> None:
    scaler = make_scaler("bf16", "cpu")
    with caplog.at_level(logging.INFO, logger="torchslurm.train.strategy"):
        assert not restore_scaler(scaler, dict(SAVED_SCALER))
    assert scaler.state_dict() == {} and caplog.messages == []

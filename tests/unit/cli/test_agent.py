"""The torchrun-mode agent's decisions: its exit code after workers that stopped on request, torchrun's
options changed for a job, and its SIGTERM handler (the end to end run: tests/multiproc/test_run.py
and, under Slurm, tests/cluster/test_preemption.py)."""

from __future__ import annotations

import logging
import signal

import pytest
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException

from torchslurm.cli.agent import TermHandler, settings, stopped_code
from torchslurm.runtime.launch import signal_exit_code


@pytest.mark.parametrize(("exitcodes", "code"), [
    ([75, 75], 75), ([130], 130), ([75, 130], 130),  # stopped on request: the workers' own code
    ([75, 1], None), ([-9], None), ([], None),  # a failure among them: torch reports it
])
def test_workers_that_stopped_on_request_end_the_agent_with_their_code(exitcodes: list[int], code: int | None) -> None:
    assert stopped_code(exitcodes) == code


def test_after_a_signal_the_agent_exits_as_its_workers_do() -> None:
    assert [signal_exit_code(s) for s in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP)] == [
        75, 75, 130, 129]


def test_sigterm_is_left_to_the_agent_and_the_workers_get_the_grace_period() -> None:
    args = torchrun.parse_args(["--nproc-per-node=2", "train.py"])  # type: ignore[no-untyped-call]
    settings(args, {"TORCHSLURM_GRACE_S": "120"})
    assert (args.signals_to_handle, args.shutdown_timeout) == ("SIGINT,SIGHUP,SIGQUIT", 120)
    short = torchrun.parse_args(["--shutdown-timeout=5", "--signals-to-handle=SIGTERM,SIGUSR1", "t.py"])  # type: ignore[no-untyped-call]
    settings(short, {"TORCHSLURM_GRACE_S": "10"})
    assert (short.signals_to_handle, short.shutdown_timeout) == ("SIGUSR1", 5)  # a timeout given stays
    unset = torchrun.parse_args(["t.py"])  # type: ignore[no-untyped-call]
    settings(unset, {"TORCHSLURM_GRACE_S": "10"})
    assert unset.shutdown_timeout == 30  # never below torch's own
    settings(plain := torchrun.parse_args(["t.py"]), {})  # type: ignore[no-untyped-call]
    assert plain.shutdown_timeout is None  # not a preemptible job: torch's default


def test_the_first_sigterm_ends_the_agent_and_the_next_ones_let_it_wait_for_its_workers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    elastic = [logging.getLogger(n) for n in list(logging.Logger.manager.loggerDict) if n.startswith("torch.dist")]
    for logger in elastic:  # put back afterwards: the handler quiets them for the rest of the process
        monkeypatch.setattr(logger, "level", logger.level)
    handler = TermHandler(SignalException)
    with pytest.raises(SignalException) as raised:
        handler(signal.SIGTERM, None)
    assert raised.value.sigval == signal.SIGTERM and handler.received == signal.SIGTERM
    assert logging.getLogger("torch.distributed.elastic.agent.server.api").level == logging.ERROR  # no chatter
    handler(signal.SIGTERM, None)  # the requeue's SIGTERM, while the workers save: ignored
    done = TermHandler(SignalException)
    done.running = False
    done(signal.SIGTERM, None)  # after the agent returned: nothing to end
    assert done.received is None

"""torchslurm.doctor.probe: the facts recorded on this very machine, and a real `scontrol ping`."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from torchslurm.doctor import checks as doctor
from torchslurm.doctor import probe


def test_gather_records_this_machine() -> None:
    f = probe.gather({"PATH": "/usr/bin:/bin", "MASTER_ADDR": "127.0.0.1"}, which=lambda name: None)
    assert any(entry.loopback for entry in f.interfaces)
    assert f.master_ips == ("127.0.0.1",) and f.source == "127.0.0.1"
    assert f.torch is not None and f.torch.gloo
    assert not doctor.report(f, doctor.run_checks(f)).failed


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm's client (scontrol) is not installed")
def test_the_real_scontrol_ping_of_a_controller_nobody_runs_is_reported_down(tmp_path: Path) -> None:
    with socket.socket() as closed:  # bound, never listening: slurmctld's port refuses connections
        closed.bind(("127.0.0.1", 0))
        conf = tmp_path / "slurm.conf"
        conf.write_text(f"ClusterName=pingtest\nSlurmctldHost=localhost(127.0.0.1)\n"
                        f"SlurmctldPort={closed.getsockname()[1]}\nNodeName=n1\n")
        found = probe.gather({"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"})
    check = doctor.check_controller(found)
    assert found.controller is not None and found.controller[0] != 0, found.controller
    assert check.status == "warning" and "(primary) is DOWN" in check.detail, check

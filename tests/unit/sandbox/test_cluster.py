"""torchslurm.sandbox.cluster, the parts that run without root: package install and the root check."""

from __future__ import annotations

import re

import pytest

from torchslurm.errors import EnvError
from torchslurm.sandbox import cluster as sandbox


def test_missing_slurm_is_installed_with_apt_get() -> None:
    calls: list[tuple[list[str], dict[str, str]]] = []

    def run(argv: list[str], env: dict[str, str], timeout_s: float) -> None:
        calls.append((argv, env))

    def which(cmd: str, path: str) -> str | None:
        return None if cmd in ("slurmd", "munged") else f"/usr/bin/{cmd}"

    assert sandbox.ensure_packages(run=run, which=which) == ["slurmd", "munge"]  # type: ignore[arg-type]
    assert [argv for argv, _ in calls] == [
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurmctld", "slurmd", "slurm-client", "munge"]]
    assert all(env["DEBIAN_FRONTEND"] == "noninteractive" for _, env in calls)
    assert sandbox.ensure_packages(run=run, which=lambda cmd, path: "/usr/bin/x") == []
    assert len(calls) == 2


def test_without_apt_get_the_error_names_the_packages() -> None:
    with pytest.raises(EnvError, match=re.escape("Slurm packages missing (slurmctld, slurmd, slurm-client, munge) "
                                                 "and apt-get not found")):
        sandbox.ensure_packages(which=lambda cmd, path: None)


def test_not_root_is_refused_with_a_hint() -> None:
    with pytest.raises(EnvError, match=re.escape("needs root (effective uid is 1000)")) as info:
        sandbox.require_root(euid=1000)
    assert info.value.hint == "sudo torchslurm sandbox up"
    sandbox.require_root(euid=0)

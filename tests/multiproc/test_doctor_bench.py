"""`torchslurm bench` and `torchslurm doctor --ranks/--connect` with real local ranks over Gloo."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.multiproc.conftest import clean_environ

pytestmark = pytest.mark.multiproc

TORCHSLURM = [sys.executable, "-m", "torchslurm"]




def torchslurm(*argv: str, timeout_s: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TORCHSLURM, *argv], capture_output=True, text=True, timeout=timeout_s,
                          env=clean_environ(**env), stdin=subprocess.DEVNULL)


def reports(stdout: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return sorted(found, key=lambda r: r["rank"])


def checks(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in report["checks"]}


def test_bench_on_two_local_ranks_prints_every_size_with_positive_bandwidth(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = torchslurm("bench", "--nproc", "2", "--sizes", "1K,64K,256K", "--iters", "3", "--warmup", "1",
                        "--json", str(out))
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()
            if line.startswith(("all_reduce", "all_gather", "broadcast"))]
    assert sorted((r[0], r[1]) for r in rows) == sorted(
        (op, size) for op in ("all_reduce", "all_gather", "broadcast") for size in ("1K", "64K", "256K"))
    assert all(float(r[3]) > 0 and float(r[4]) > 0 and float(r[5]) > 0 for r in rows), result.stdout
    assert result.stdout.count("torchslurm bench: 2 rank(s)") == 1  # rank 0 prints, once
    saved = json.loads(out.read_text())
    assert (saved["world_size"], saved["backend"], saved["device"]) == (2, "gloo", "cpu")
    assert len(saved["results"]) == 9
    for row in saved["results"]:
        factor = {"all_reduce": 1.0, "all_gather": 0.5, "broadcast": 1.0}[row["op"]]  # nccl-tests, n = 2
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / (row["time_us"] * 1e-6) / 1e9)


def test_bench_rejects_a_bad_size_before_starting_ranks() -> None:
    result = torchslurm("bench", "--nproc", "2", "--sizes", "1K,lots")
    assert result.returncode == 2
    assert "--sizes: 'lots' is not a message size" in result.stderr and "HINT:" in result.stderr


def test_doctor_ranks_connect_two_local_ranks() -> None:
    result = torchslurm("doctor", "--ranks", "--nproc", "2", "--connect", "--timeout", "60", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    found = reports(result.stdout)
    assert [(r["rank"], r["world_size"], r["launcher"], r["ok"]) for r in found] == [
        (0, 2, "torchrun", True), (1, 2, "torchrun", True)]
    for r in found:
        connect = checks(r)["connect"]
        assert connect["status"] == "ok" and "summed to 2" in connect["detail"], connect
        assert checks(r)["gloo_socket_ifname"]["value"] == "lo"


def test_doctor_ranks_report_a_missing_interface_and_exit_non_zero() -> None:
    result = torchslurm("doctor", "--ranks", "--nproc", "2", "--json", GLOO_SOCKET_IFNAME="nosuchnic0")
    assert result.returncode == 1, result.stdout + result.stderr
    found = reports(result.stdout)
    assert len(found) == 2
    for r in found:
        gloo = checks(r)["gloo_socket_ifname"]
        assert gloo["status"] == "fail" and "GLOO_SOCKET_IFNAME=nosuchnic0" in gloo["detail"]
    assert "the doctor found a failure" in result.stderr


def test_doctor_ranks_text_reports_come_in_rank_order_each_line_prefixed() -> None:
    result = torchslurm("doctor", "--ranks", "--nproc", "3", GLOO_SOCKET_IFNAME="nosuchnic0")
    assert result.returncode == 1, result.stdout + result.stderr
    headers = [line for line in result.stdout.splitlines() if "torchslurm doctor on" in line]
    assert [h.split(":", 1)[0].split("/")[1] for h in headers] == ["0", "1", "2"], result.stdout
    fails = [line for line in result.stdout.splitlines() if "FAIL  gloo_socket_ifname" in line]
    assert len(fails) == 3 and all("GLOO_SOCKET_IFNAME=nosuchnic0" in line for line in fails), result.stdout


def test_doctor_connect_to_a_master_nobody_runs_fails_with_the_runtimes_message() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    result = torchslurm("doctor", "--connect", "--timeout", "2", RANK="1", WORLD_SIZE="2", LOCAL_RANK="0",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=port, timeout_s=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL  connect" in result.stdout
    assert f"could not reach the master at 127.0.0.1:{port}" in result.stdout
    assert "NCCL_DEBUG=INFO" in result.stdout

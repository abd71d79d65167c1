"""torchslurm.doctor.netcheck: MASTER_ADDR, MASTER_PORT and *_SOCKET_IFNAME checked on recorded facts."""

from __future__ import annotations

from tests.unit.doctor.conftest import (
    BATCH,
    CPU_TORCH,
    GPU_TORCH,
    NODE1,
    NODE2,
    SRUN,
    assert_actionable,
    by_name,
    facts,
)

from torchslurm.doctor import netcheck
from torchslurm.doctor.facts import Check, TorchFacts
from torchslurm.errors import EnvError
from torchslurm.runtime.netif import IfAddr

# ---- master address and port -------------------------------------------------------------------


def test_master_resolving_to_loopback_on_the_master_node_warns() -> None:
    env = {**SRUN, "SLURM_PROCID": "0", "SLURM_NODEID": "0"}
    check = netcheck.check_master_addr(facts(env, hostname="node1", interfaces=NODE1, master_ips=("127.0.1.1",),
                                           source="127.0.0.1"))
    assert check.status == "warning"
    assert_actionable(check, "MASTER_ADDR (unset; torchslurm uses node1) resolves to 127.0.1.1")
    assert "/etc/hosts" in check.hint


def test_master_resolving_to_loopback_on_another_node_fails() -> None:
    check = netcheck.check_master_addr(facts(SRUN, master_ips=("127.0.1.1",), source="127.0.0.1"))
    assert check.status == "error"
    assert_actionable(check, "MASTER_ADDR (unset; torchslurm uses node1) resolves to 127.0.1.1", "2 nodes")


def test_localhost_master_in_a_multi_node_step_fails() -> None:
    check = netcheck.check_master_addr(facts({**SRUN, "MASTER_ADDR": "localhost"}, master_ips=("127.0.0.1",),
                                           source="127.0.0.1"))
    assert check.status == "error" and "MASTER_ADDR=localhost" in check.detail


def test_unresolvable_and_unroutable_master_fail() -> None:
    error = EnvError("MASTER_ADDR='node1' does not resolve on host node2.", "use a host name of this job's node list")
    bad = netcheck.check_master_addr(facts(SRUN, master_ips=(), resolve_error=error))
    assert (bad.status, bad.detail, bad.hint) == ("error", error.message, error.hint)
    unroutable = netcheck.check_master_addr(facts(SRUN, source=None))
    assert unroutable.status == "error" and "no route" in unroutable.detail


def test_batch_shell_checks_the_master_its_ranks_will_use() -> None:
    check = netcheck.check_master_addr(facts(BATCH, hostname="node1", interfaces=NODE1, source="198.18.0.11"))
    assert (check.status, check.value) == ("ok", "node1")
    assert check.detail.startswith("MASTER_ADDR (unset; torchslurm uses node1) resolves to"), check.detail


def test_hard_coded_master_addr_that_is_not_rank_0s_node_fails() -> None:
    env = {**SRUN, "MASTER_ADDR": "192.168.20.15"}
    check = netcheck.check_master_addr(facts(env, master_ips=("192.168.20.15",), first_node_ips=("198.18.0.11",)))
    assert check.status == "error"
    assert_actionable(check, "MASTER_ADDR=192.168.20.15", "rank 0 runs on node1")
    assert "remove MASTER_ADDR" in check.hint
    same_node = facts({**SRUN, "MASTER_ADDR": "198.18.0.11"}, first_node_ips=("198.18.0.11",))
    assert netcheck.check_master_addr(same_node).status == "ok"
    # another node of the step: its first task hosts the store (runtime.distenv), so the job trains
    other_node = facts({**SRUN, "MASTER_ADDR": "node2"}, master_ips=("198.18.0.12",), first_node_ips=("198.18.0.11",))
    assert netcheck.check_master_addr(other_node).status == "ok"


def test_fixed_master_port_inside_slurm_warns() -> None:
    check = netcheck.check_master_port(facts({**SRUN, "MASTER_PORT": "29500"}))
    assert (check.status, check.value) == ("warning", "29500")
    assert_actionable(check, "MASTER_PORT=29500", "job 42")
    assert "unset MASTER_PORT" in check.hint


def test_master_port_ok_when_derived_set_by_torchrun_or_outside_slurm() -> None:
    assert netcheck.check_master_port(facts(SRUN)).status == "ok"
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                "MASTER_ADDR": "node1", "MASTER_PORT": "29500", "SLURM_JOB_ID": "42"}
    assert netcheck.check_master_port(facts(torchrun)).status == "ok"
    assert netcheck.check_master_port(facts({"MASTER_PORT": "29500"})).status == "ok"


# ---- network interfaces -------------------------------------------------------------------------


def test_unset_socket_ifnames_report_this_nodes_own_nic() -> None:
    checks = by_name(netcheck.check_interfaces(facts(SRUN)))
    assert (checks["gloo_socket_ifname"].status, checks["gloo_socket_ifname"].value) == ("ok", "ens1f0")
    assert checks["nccl_socket_ifname"].value == "ens1f0"
    assert "198.18.0.12 on ens1f0" in checks["gloo_socket_ifname"].detail


def test_one_gloo_socket_ifname_for_all_nodes_fails_where_it_does_not_exist() -> None:
    checks = by_name(netcheck.check_interfaces(facts({**SRUN, "GLOO_SOCKET_IFNAME": "eth0"})))
    gloo = checks["gloo_socket_ifname"]
    assert gloo.status == "error"
    assert_actionable(gloo, "GLOO_SOCKET_IFNAME=eth0", "node2", "ens1f0")
    assert "unset GLOO_SOCKET_IFNAME" in gloo.hint and "ens1f0 here" in gloo.hint
    on_node1 = netcheck.check_interfaces(facts({**SRUN, "SLURM_NODEID": "0", "SLURM_PROCID": "0",
                                              "GLOO_SOCKET_IFNAME": "eth0"}, hostname="node1", interfaces=NODE1,
                                             source="198.18.0.11", own_addresses=("198.18.0.11",)))
    assert by_name(on_node1)["gloo_socket_ifname"].status == "ok"


def test_nccl_socket_ifname_prefix_exact_and_exclusion_syntax() -> None:
    def nccl(value: str, torch: TorchFacts = GPU_TORCH) -> Check:
        env = {**SRUN, "NCCL_SOCKET_IFNAME": value, "CUDA_VISIBLE_DEVICES": "0,1"}
        return by_name(netcheck.check_interfaces(facts(env, torch=torch)))["nccl_socket_ifname"]

    assert nccl("ens").status == "ok"            # prefix match, NCCL's default
    assert nccl("=ens1f0").status == "ok"
    assert nccl("=ens").status == "error"         # '=' means exact
    assert nccl("^docker,lo").status == "ok"
    assert nccl("eth").status == "error" and "NCCL_SOCKET_IFNAME=eth" in nccl("eth").detail
    assert nccl("eth", CPU_TORCH).status == "warning"  # Gloo job: NCCL's variable does not matter
    # what torchslurm itself sets for a rank: shown readably, not as NCCL_SOCKET_IFNAME==ens1f0
    assert "NCCL_SOCKET_IFNAME='=ens1f0' (exactly ens1f0) is set" in nccl("=ens1f0").detail
    assert "==" not in nccl("=ens1f0").detail


def test_loopback_socket_ifname_in_a_multi_node_step_fails() -> None:
    gloo = by_name(netcheck.check_interfaces(facts({**SRUN, "GLOO_SOCKET_IFNAME": "lo"})))["gloo_socket_ifname"]
    assert gloo.status == "error" and "loopback" in gloo.detail and gloo.hint


def test_socket_ifname_that_is_not_the_route_to_the_master_warns() -> None:
    table = (*NODE2, IfAddr("docker0", "172.17.0.1"))
    gloo = by_name(netcheck.check_interfaces(facts({**SRUN, "GLOO_SOCKET_IFNAME": "docker0"}, interfaces=table)))
    assert gloo["gloo_socket_ifname"].status == "warning"
    assert "GLOO_SOCKET_IFNAME=ens1f0" in gloo["gloo_socket_ifname"].hint


def test_no_interface_choice_fails_with_the_runtimes_hint() -> None:
    table = (*NODE1, IfAddr("eth1", "10.0.0.1"))
    env = {**SRUN, "SLURM_NODEID": "0", "SLURM_PROCID": "0"}
    checks = by_name(netcheck.check_interfaces(facts(env, hostname="node1", interfaces=table,
                                                   master_ips=("127.0.1.1",), source="127.0.0.1", own_addresses=())))
    gloo = checks["gloo_socket_ifname"]
    assert gloo.status == "error" and "ambiguous" in gloo.detail and "HINT" not in gloo.detail
    assert "/etc/hosts" in gloo.hint


def test_master_port_that_torchslurm_run_derived_for_this_step_is_ok() -> None:
    from torchslurm.runtime.ports import derived_port

    port = str(derived_port("42", "0"))
    check = netcheck.check_master_port(facts({**SRUN, "MASTER_PORT": port}))
    assert (check.status, check.value) == ("ok", port)

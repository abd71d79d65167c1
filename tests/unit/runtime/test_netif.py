"""torchslurm.runtime.netif: pure decisions on recorded data, the real effects on loopback, and (as root)
two network namespaces with differently named NICs, including a real Gloo all_reduce across them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchslurm.errors import EnvError
from torchslurm.runtime import netif
from torchslurm.runtime.netif import IfAddr, choose_interface, parse_ip_addr, socket_ifname_env

# `ip -o addr show up` recorded on this project's CI machine, and inside a namespace shaped like a
# sandbox node (veth renamed ens1f0, a secondary address with a label, a docker bridge).
IP_ADDR_VM = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever preferred_lft forever
4: eth0    inet6 fd00::2/64 scope global nodad \\       valid_lft forever preferred_lft forever
4: eth0    inet6 fe80::fc:ff:fe00:1/64 scope link \\       valid_lft forever preferred_lft forever
"""
IP_ADDR_NODE = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
2: ens1f0    inet 198.18.0.201/24 scope global ens1f0\\       valid_lft forever preferred_lft forever
2: ens1f0    inet 198.18.0.203/24 scope global secondary ens1f0:1\\       valid_lft forever preferred_lft forever
2: ens1f0    inet6 fe80::40:e4ff:fe8e:bf1c/64 scope link tentative \\       valid_lft forever preferred_lft forever
3: docker0    inet 172.17.0.1/16 scope global docker0\\       valid_lft forever preferred_lft forever
3: docker0@if7    inet6 fe80::98f4:1dff:fefc:de7c/64 scope link tentative \\       valid_lft forever
"""
NODE = parse_ip_addr(IP_ADDR_NODE)


def test_parse_ip_addr_recorded_outputs() -> None:
    assert parse_ip_addr(IP_ADDR_VM) == [
        IfAddr("lo", "127.0.0.1"), IfAddr("lo", "::1"), IfAddr("eth0", "192.0.2.2"),
        IfAddr("eth0", "fd00::2"), IfAddr("eth0", "fe80::fc:ff:fe00:1"),
    ]
    assert [(entry.name, entry.address) for entry in NODE] == [
        ("lo", "127.0.0.1"), ("lo", "::1"), ("ens1f0", "198.18.0.201"), ("ens1f0", "198.18.0.203"),
        ("ens1f0", "fe80::40:e4ff:fe8e:bf1c"), ("docker0", "172.17.0.1"), ("docker0", "fe80::98f4:1dff:fefc:de7c"),
    ]
    assert [entry.loopback for entry in NODE[:3]] == [True, True, False]
    assert parse_ip_addr("garbage\n\n2: eth0 link/ether 00:11\n") == []


def test_worker_node_uses_the_interface_of_its_source_address() -> None:
    name, reason = choose_interface("node1", ["198.18.0.11"], "198.18.0.203", NODE, [])
    assert name == "ens1f0"
    assert reason == "the kernel reaches node1 (198.18.0.11) from 198.18.0.203 on ens1f0"


def test_master_by_own_ip_is_not_loopback() -> None:
    # `ip route get <own ip>` says `dev lo`; the source address still belongs to ens1f0.
    assert choose_interface("198.18.0.201", ["198.18.0.201"], "198.18.0.201", NODE, [])[0] == "ens1f0"


def test_master_node_with_debian_hosts_entry_falls_back_to_own_address() -> None:
    name, reason = choose_interface("node1", ["127.0.1.1"], "127.0.0.1", NODE, ["127.0.1.1", "198.18.0.201"])
    assert name == "ens1f0"
    assert "this host's name resolves to 198.18.0.201 on ens1f0" in reason


def test_master_node_falls_back_to_the_only_ordinary_interface() -> None:
    # docker0 is ignored: no other node can reach a container bridge.
    name, reason = choose_interface("node1", ["127.0.1.1"], "127.0.0.1", NODE, ["127.0.1.1"])
    assert (name, reason.endswith("ens1f0 is the only non-loopback interface")) == ("ens1f0", True)


def test_master_node_with_several_interfaces_is_an_error() -> None:
    table = [*NODE, IfAddr("ib0", "10.0.0.5")]
    with pytest.raises(EnvError) as caught:
        choose_interface("node1", ["127.0.1.1"], "127.0.0.1", table, [])
    message = str(caught.value)
    assert "MASTER_ADDR='node1' resolves to loopback (127.0.1.1)" in message
    assert "several interfaces (ens1f0, ib0)" in message
    assert "HINT: give this host's name its real address in /etc/hosts" in message


def test_local_master_uses_loopback() -> None:
    for master in ("localhost", "127.0.0.1", "::1"):
        name, reason = choose_interface(master, ["127.0.0.1"], "127.0.0.1", NODE, ["198.18.0.201"])
        assert (name, "single-machine run" in reason) == ("lo", True)


def test_machine_without_network_uses_loopback() -> None:
    lo_only = [IfAddr("lo", "127.0.0.1")]
    assert choose_interface("laptop", ["127.0.1.1"], "127.0.0.1", lo_only, [])[0] == "lo"


def test_source_address_on_no_interface_is_an_error() -> None:
    with pytest.raises(EnvError, match=r"from 10\.9\.9\.9, which no UP interface holds \(lo 127\.0\.0\.1\).*HINT:"):
        choose_interface("node1", ["198.18.0.11"], "10.9.9.9", [IfAddr("lo", "127.0.0.1")], [])


def _no_effects() -> dict[str, object]:
    def fail(*_: object) -> object:
        raise AssertionError("no effect may run when the user set both variables")

    return {"resolve_fn": fail, "source_fn": fail, "interfaces_fn": fail, "own_addresses_fn": fail}


def test_user_values_win() -> None:
    both = {"NCCL_SOCKET_IFNAME": "^lo,docker", "GLOO_SOCKET_IFNAME": "eth1"}
    assert socket_ifname_env(both, "node1", **_no_effects()) == {}  # type: ignore[arg-type]
    only_nccl = socket_ifname_env(
        {"NCCL_SOCKET_IFNAME": "ib0"}, "node1", resolve_fn=lambda _: ["198.18.0.11"],
        source_fn=lambda _: "198.18.0.201", interfaces_fn=lambda: NODE, own_addresses_fn=list,
    )
    assert only_nccl == {"GLOO_SOCKET_IFNAME": "ens1f0"}


def test_nccl_gets_an_exact_match_and_gloo_a_plain_name() -> None:
    env = socket_ifname_env({"GLOO_SOCKET_IFNAME": ""}, "node1", resolve_fn=lambda _: ["fd00::9", "198.18.0.11"],
                            source_fn=lambda ip: None if ":" in ip else "198.18.0.201",
                            interfaces_fn=lambda: NODE, own_addresses_fn=list)
    assert env == {"NCCL_SOCKET_IFNAME": "=ens1f0", "GLOO_SOCKET_IFNAME": "ens1f0"}


def test_unroutable_master_is_an_error() -> None:
    expected = r"MASTER_ADDR='node9' resolves to 10\.1\.1\.1, but this host .* no route.*HINT:"
    with pytest.raises(EnvError, match=expected):
        socket_ifname_env({}, "node9", resolve_fn=lambda _: ["10.1.1.1"], source_fn=lambda _: None,
                          interfaces_fn=lambda: NODE, own_addresses_fn=list)


# --- the real effects, loopback only -----------------------------------------------------------


def test_real_loopback_master() -> None:
    assert socket_ifname_env({}, "127.0.0.1") == {"NCCL_SOCKET_IFNAME": "=lo", "GLOO_SOCKET_IFNAME": "lo"}
    assert socket_ifname_env({}, "localhost")["GLOO_SOCKET_IFNAME"] == "lo"
    assert netif.source_address("127.0.0.1") == "127.0.0.1"
    assert netif.resolve("127.0.0.1") == ["127.0.0.1"]


def test_real_interface_tables_hold_loopback() -> None:
    assert IfAddr("lo", "127.0.0.1") in netif.list_interfaces()
    assert IfAddr("lo", "127.0.0.1") in netif._ioctl_interfaces()  # the path for hosts without iproute2


# --- two network namespaces, differently named NICs (root) ---------------------------------------

NETNS_TOOLS = all(shutil.which(tool) for tool in ("ip", "nsenter", "unshare"))
needs_root = pytest.mark.skipif(os.geteuid() != 0 or not NETNS_TOOLS,
                                reason="needs root and ip/nsenter/unshare to build network namespaces")
SRC = Path(__file__).parents[3] / "src"
# Addresses 198.18.0.201+ stay clear of the sandbox cluster (.1, .11-.20).
NODES = {"nodea1": ("ens1f0", "198.18.0.201"), "nodea2": ("enp65s0f1", "198.18.0.202")}


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two namespaces joined by one veth pair whose ends are named ens1f0 and enp65s0f1."""
    tag = f"tsnetA{os.getpid() % 100000}"
    namespaces = {host: f"{tag}{host[-1]}" for host in NODES}
    try:
        for namespace in namespaces.values():
            _ip("netns", "add", namespace)
            _ip("-n", namespace, "link", "set", "lo", "up")
        (if1, _), (if2, _) = NODES.values()
        _ip("-n", namespaces["nodea1"], "link", "add", if1, "type", "veth", "peer", "name", if2,
            "netns", namespaces["nodea2"])
        for host, (ifname, address) in NODES.items():
            _ip("-n", namespaces[host], "addr", "add", f"{address}/24", "dev", ifname)
            _ip("-n", namespaces[host], "link", "set", ifname, "up")
        yield namespaces
    finally:
        for namespace in namespaces.values():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _on_node(namespaces: dict[str, str], host: str, hosts_file: Path, code: str,
             timeout_s: float = 30) -> subprocess.Popen[str]:
    """Run python code inside host's network namespace with its own hostname and /etc/hosts."""
    shell = f'hostname {host} && mount --bind "$1" /etc/hosts && exec "$2" -c "$3"'
    argv = ["nsenter", f"--net=/run/netns/{namespaces[host]}", "unshare", "--uts", "--mount",
            "--propagation", "private", "sh", "-c", shell, "sh", str(hosts_file), sys.executable, code]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(SRC), "TORCH_CPP_LOG_LEVEL": "ERROR"}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ifname_env(namespaces: dict[str, str], host: str, hosts_file: Path, master: str) -> dict[str, str]:
    code = ("import json; from torchslurm.runtime.netif import socket_ifname_env\n"
            "from torchslurm.errors import EnvError\n"
            f"try: print(json.dumps(socket_ifname_env({{}}, {master!r})))\n"
            "except EnvError as e: print(json.dumps({'error': str(e)}))")
    out, err = _on_node(namespaces, host, hosts_file, code).communicate(timeout=30)
    assert out, err
    return dict(json.loads(out))


def _hosts(tmp_path: Path, seen_from: str, debian_style: bool = False) -> Path:
    """The /etc/hosts of node seen_from; Debian-style gives its own name 127.0.1.1."""
    lines = ["127.0.0.1 localhost"]
    lines += [f"127.0.1.1 {host}" if debian_style and host == seen_from else f"{address} {host}"
              for host, (_, address) in NODES.items()]
    path = tmp_path / f"hosts-{seen_from}-{debian_style}"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.cluster
@needs_root
def test_each_node_finds_its_own_nic_name(two_nodes: dict[str, str], tmp_path: Path) -> None:
    assert _ifname_env(two_nodes, "nodea2", _hosts(tmp_path, "nodea2"), "nodea1") == {
        "NCCL_SOCKET_IFNAME": "=enp65s0f1", "GLOO_SOCKET_IFNAME": "enp65s0f1"}
    hosts = _hosts(tmp_path, "nodea1")
    assert _ifname_env(two_nodes, "nodea1", hosts, "nodea1")["GLOO_SOCKET_IFNAME"] == "ens1f0"
    assert _ifname_env(two_nodes, "nodea1", hosts, "198.18.0.201")["GLOO_SOCKET_IFNAME"] == "ens1f0"


@pytest.mark.cluster
@needs_root
def test_master_whose_name_is_loopback_still_gets_its_nic(two_nodes: dict[str, str], tmp_path: Path) -> None:
    hosts = _hosts(tmp_path, "nodea1", debian_style=True)
    assert _ifname_env(two_nodes, "nodea1", hosts, "nodea1")["GLOO_SOCKET_IFNAME"] == "ens1f0"


@pytest.mark.cluster
@needs_root
def test_unresolvable_master_names_master_addr(two_nodes: dict[str, str], tmp_path: Path) -> None:
    # The namespaces have no route to a DNS server, so an unknown name fails at once, offline.
    result = _ifname_env(two_nodes, "nodea2", _hosts(tmp_path, "nodea2"), "nodeb7")
    assert result["error"].startswith("MASTER_ADDR='nodeb7' does not resolve on host nodea2")
    assert "HINT: use a host name of this job's node list" in result["error"]


GLOO_RANK = """
import os, torch, torch.distributed as dist
from torchslurm.runtime.netif import socket_ifname_env
rank = {rank}
os.environ.update(socket_ifname_env(os.environ, "nodea1"))
dist.init_process_group("gloo", init_method="tcp://nodea1:29517", rank=rank, world_size=2,
                        timeout=__import__("datetime").timedelta(seconds=60))
t = torch.tensor([rank + 1.0]); dist.all_reduce(t)
print(os.environ["GLOO_SOCKET_IFNAME"], t.item(), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.cluster
@needs_root
def test_gloo_all_reduce_across_nodes_with_debian_hosts_entry(two_nodes: dict[str, str], tmp_path: Path) -> None:
    """A Debian-style /etc/hosts for real: the master's name is 127.0.1.1 on the master; with the interface chosen by
    netif, Gloo binds ens1f0 there and enp65s0f1 on the other node, and the all_reduce completes."""
    ranks = [_on_node(two_nodes, host, _hosts(tmp_path, host, debian_style=True), GLOO_RANK.format(rank=rank))
             for rank, host in enumerate(("nodea1", "nodea2"))]
    outputs = [rank.communicate(timeout=90) for rank in ranks]
    errors = "\n".join(err for _, err in outputs)
    assert [out.split() for out, _ in outputs] == [["ens1f0", "3.0"], ["enp65s0f1", "3.0"]], errors

"""The sandbox's decisions: names, addresses, config texts, daemon command lines. Pure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchslurm.errors import ConfigError
from torchslurm.hostlist import expand
from torchslurm.sandbox.config import (
    SandboxConfig,
    config_from_state,
    exec_argv,
    job_environ,
    missing_packages,
    netns_name,
    network_commands,
    nic_name,
    node_addr,
    node_index,
    parse_sinfo_states,
    render_env_sh,
    render_gres_conf,
    render_hosts,
    render_slurm_conf,
    slurmd_argv,
    state_json,
    veth_name,
)

LAB = Path("/srv/lab")


def cfg(**kw: object) -> SandboxConfig:
    return SandboxConfig(lab_dir=LAB, python_bin=Path("/opt/venv/bin"), **kw)  # type: ignore[arg-type]


def conf_values(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
                and not line.startswith(("NodeName", "PartitionName")))


def test_every_node_has_its_own_nic_name_and_address() -> None:
    names = [nic_name(i) for i in range(1, 17)]
    assert names[:4] == ["eth0", "ens1f0", "enp65s0f1", "eno1"]
    assert len(set(names)) == 16 and all(len(n) <= 15 for n in names)  # IFNAMSIZ
    assert [node_addr(i) for i in (1, 4)] == ["198.18.0.11", "198.18.0.14"]


def test_hosts_file_names_every_node_by_its_real_address_and_never_127_0_1_1() -> None:
    text = render_hosts(cfg(nodes=3))
    assert "198.18.0.1 slurmctl" in text
    assert [line for line in text.splitlines() if "node" in line and "mapped" not in line] == [
        "198.18.0.11 node1", "198.18.0.12 node2", "198.18.0.13 node3"]
    assert "127.0.1.1" not in text


def test_hosts_file_names_ipv4_mapped_addresses_for_reverse_lookups_only() -> None:
    """c10d's client looks up its own dual-stack address; the real names stay IPv4-only."""
    lines = render_hosts(cfg(nodes=2)).splitlines()
    assert "::ffff:198.18.0.12 node2-ipv4-mapped" in lines
    assert "::ffff:127.0.0.1 localhost-ipv4-mapped" in lines
    assert not [line for line in lines if line.startswith("::ffff:") and line.split()[1] in ("node1", "node2")]


def test_slurm_conf_node_line_matches_the_node_count_and_gpus() -> None:
    text = render_slurm_conf(cfg(nodes=4, gpus_per_node=2, cpus_per_node=8))
    node_line = next(line for line in text.splitlines() if line.startswith("NodeName="))
    fields = dict(f.split("=", 1) for f in node_line.split())
    assert expand(fields["NodeName"]) == ["node1", "node2", "node3", "node4"]
    assert expand(fields["NodeAddr"]) == [f"198.18.0.{i}" for i in (11, 12, 13, 14)]
    assert (fields["CPUs"], fields["Gres"]) == ("8", "gpu:2")


def test_sixty_four_nodes_fit_the_sandbox_subnet_with_distinct_names() -> None:
    c = cfg(nodes=64)
    node_line = next(line for line in render_slurm_conf(c).splitlines() if line.startswith("NodeName="))
    fields = dict(f.split("=", 1) for f in node_line.split())
    assert expand(fields["NodeName"]) == [f"node{i}" for i in range(1, 65)]
    assert expand(fields["NodeAddr"].replace("198.18.0.", "x")) == [f"x{i}" for i in range(11, 75)]
    for name in (nic_name, netns_name, veth_name):
        assert len({name(i) for i in c.node_indexes()}) == 64
        assert all(len(name(i)) <= 15 for i in c.node_indexes())  # IFNAMSIZ - 1


@pytest.mark.parametrize(("nodes", "seconds"), [(4, "10"), (16, "10"), (17, "60"), (64, "60")])
def test_daemons_get_longer_to_answer_beyond_sixteen_nodes_on_the_same_cores(nodes: int, seconds: str) -> None:
    assert conf_values(render_slurm_conf(cfg(nodes=nodes)))["MessageTimeout"] == seconds


def test_slurm_conf_single_node_has_no_brackets_and_no_gres_without_gpus() -> None:
    node_line = next(line for line in render_slurm_conf(cfg(nodes=1, gpus_per_node=0)).splitlines()
                     if line.startswith("NodeName="))
    assert node_line.startswith("NodeName=node1 NodeAddr=198.18.0.11 ")
    assert "Gres=" not in node_line


def test_slurm_conf_keeps_every_file_inside_the_lab_and_per_node_dirs_apart() -> None:
    values = conf_values(render_slurm_conf(cfg()))
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "TmpFS", "SlurmctldPidFile", "SlurmdPidFile",
                "SlurmctldLogFile", "SlurmdLogFile", "JobCompLoc", "PlugStackConfig"):
        assert values[key].startswith(str(LAB) + "/"), key
    # /tmp is shared by all emulated nodes: per-node dirs need %n (slurmd expands it to the node name).
    for key in ("SlurmdSpoolDir", "TmpFS", "SlurmdPidFile", "SlurmdLogFile"):
        assert "%n" in values[key], key
    assert values["AuthInfo"] == f"socket={LAB}/munge/munge.sock"
    assert values["SlurmctldHost"] == "slurmctl(198.18.0.1)"
    assert values["AccountingStorageType"] == "accounting_storage/none"
    assert "AccountingStorageTRES" not in values  # slurmctld refuses it without slurmdbd


def test_gres_conf_points_at_the_lab_devices() -> None:
    assert render_gres_conf(cfg(nodes=2, gpus_per_node=4)) == (
        f"AutoDetect=off\nNodeName=node[1-2] Name=gpu File={LAB}/dev/nvidia[0-3]\n")
    assert render_gres_conf(cfg(gpus_per_node=0)) == "AutoDetect=off\n"


def test_network_commands_create_each_nic_inside_its_namespace_under_its_final_name() -> None:
    cmds = network_commands(cfg(nodes=2))
    assert ["ip", "link", "set", "tsbr0", "alias", str(LAB)] in cmds
    assert ["ip", "link", "add", "tsveth2", "type", "veth", "peer", "name", "ens1f0", "netns", "tsnode2"] in cmds
    assert ["ip", "-n", "tsnode2", "addr", "add", "198.18.0.12/24", "dev", "ens1f0"] in cmds
    assert sum(c[:3] == ["ip", "netns", "add"] for c in cmds) == 2


def test_every_nic_and_the_bridge_probe_longer_for_neighbours_than_linuxs_three_seconds() -> None:
    """64 nodes connecting all to all on a loaded machine got "No route to host" with Linux's 3 probes."""
    cmds = network_commands(cfg(nodes=2))
    probes = [c for c in cmds if "ntable" in c]
    assert [c[c.index("dev") + 1] for c in probes] == ["tsbr0", "eth0", "ens1f0"]
    assert all(c[-2:] == ["mcast_probes", "20"] for c in probes)
    assert cmds.index(probes[1]) > cmds.index(["ip", "-n", "tsnode1", "link", "set", "eth0", "up"])


def test_slurmd_runs_under_nsenter_not_ip_netns_exec() -> None:
    argv = slurmd_argv(cfg(), 3)
    assert argv[:2] == ["nsenter", "--net=/run/netns/tsnode3"]
    assert "netns" not in argv[2:-1]
    script = argv[-1]
    assert script.startswith("hostname node3 && mount --bind /srv/lab/etc/hosts /etc/hosts")
    assert script.endswith("exec slurmd -f /srv/lab/etc/slurm.conf")


def test_exec_argv_enters_the_slurmd_namespaces() -> None:
    assert exec_argv(42, ["ip", "-br", "a"]) == ["nsenter", "-t", "42", "-n", "-u", "-m", "--", "ip", "-br", "a"]


def test_job_environ_points_at_the_sandbox_and_drops_stale_rank_variables() -> None:
    env = job_environ(cfg(), {"PATH": "/usr/bin", "HOME": "/root", "SLURM_JOB_ID": "9", "RANK": "3",
                              "SBATCH_PARTITION": "gpu", "GLOO_SOCKET_IFNAME": "eth0"})
    assert env == {"PATH": "/opt/venv/bin:/usr/bin", "HOME": "/root", "SLURM_CONF": f"{LAB}/etc/slurm.conf"}


def test_env_sh_exports_slurm_conf_and_path() -> None:
    assert render_env_sh(cfg()) == f'export SLURM_CONF={LAB}/etc/slurm.conf\nexport PATH=/opt/venv/bin:"$PATH"\n'


def test_state_round_trips() -> None:
    c = cfg(nodes=3, gpus_per_node=2, cpus_per_node=6)
    assert config_from_state(state_json(c)) == c


@pytest.mark.parametrize(("kw", "message"), [
    ({"nodes": 0}, "--nodes=0 is out of range; the sandbox has 1 to 64 nodes. HINT:"),
    ({"nodes": 65}, "--nodes=65 is out of range"),
    ({"gpus_per_node": 9}, "--gpus-per-node=9 is out of range; fake GPUs per node are 0 to 8. HINT:"),
    ({"cpus_per_node": 0}, "--cpus-per-node=0 is out of range"),
])
def test_invalid_sizes_are_rejected_with_a_hint(kw: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        cfg(**kw)


@pytest.mark.parametrize("lab", ["relative/lab", "/tmp/my lab", "/tmp/a;rm -rf", "/tmp/it's"])
def test_hostile_lab_dirs_are_rejected(lab: str) -> None:
    with pytest.raises(ConfigError, match=r"--lab-dir=.* must be an absolute path without spaces or shell "
                                          r"characters .*HINT: --lab-dir /tmp/torchslurm-sandbox"):
        SandboxConfig(lab_dir=Path(lab))


def test_node_index_accepts_names_and_numbers_and_lists_valid_nodes() -> None:
    assert (node_index("node2", 4), node_index("3", 4)) == (2, 3)
    message = "node 'node5' is not in the sandbox; valid nodes: node1, node2. HINT"
    with pytest.raises(ConfigError, match=re.escape(message)):
        node_index("node5", 2)


def test_missing_packages_maps_commands_to_packages() -> None:
    found = {"slurmctld": "/usr/sbin/slurmctld", "slurmd": None, "sbatch": "/usr/bin/sbatch", "munged": None}
    assert missing_packages(found) == ["slurmd", "munge"]


def test_parse_sinfo_states() -> None:
    assert parse_sinfo_states("node1 idle\nnode2 down*\n\n") == {"node1": "idle", "node2": "down*"}


@pytest.mark.parametrize(("kw", "text"), [
    ({"lab_dir": Path("relative/lab")}, "--lab-dir='relative/lab' must be an absolute path without spaces or shell "
     "characters (found a relative path); Slurm config lines cannot quote them. "
     "HINT: --lab-dir /tmp/torchslurm-sandbox"),
    ({"lab_dir": Path("/tmp/a;b$")}, "--lab-dir='/tmp/a;b$' must be an absolute path without spaces or shell "
     "characters (found $;); Slurm config lines cannot quote them. HINT: --lab-dir /tmp/torchslurm-sandbox"),
    # python_bin is no flag but the folder of the Python running torchslurm: the fix is another environment.
    ({"python_bin": Path("venv/bin")}, "python_bin='venv/bin' must be an absolute path without spaces or shell "
     "characters (found a relative path); Slurm config lines cannot quote them. HINT: run torchslurm from a "
     "Python environment whose path is absolute and plain, e.g. python3 -m venv /opt/torchslurm-venv"),
])
def test_unusable_paths_are_refused_whole(kw: dict[str, Path], text: str) -> None:
    with pytest.raises(ConfigError) as info:
        SandboxConfig(**kw)  # type: ignore[arg-type]
    assert str(info.value) == text

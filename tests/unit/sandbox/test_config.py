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
    munged_argv,
    netns_name,
    network_commands,
    nic_name,
    node_addr,
    node_index,
    parse_sinfo_states,
    render_cgroup_conf,
    render_env_sh,
    render_gres_conf,
    render_hosts,
    render_slurm_conf,
    slurmctld_argv,
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
    with pytest.raises(ConfigError, match=r"--lab-dir=.* must be an absolute path without spaces, colons "
                                          r"or shell characters .*HINT: --lab-dir /tmp/torchslurm-sandbox"):
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


def test_slurm_conf_whole_for_the_default_four_nodes() -> None:
    """What Debian's slurmctld and slurmd 22.05 start with: every address an IP, no slurmdbd."""
    assert render_slurm_conf(cfg()) == f"""\
# Written by `torchslurm sandbox up`; removed by `torchslurm sandbox down`.
ClusterName=torchslurm-sandbox
SlurmctldHost=slurmctl(198.18.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={LAB}/munge/munge.sock
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={LAB}/state
SlurmdSpoolDir={LAB}/spool/%n
TmpFS={LAB}/spool/%n
SlurmctldPidFile={LAB}/run/slurmctld.pid
SlurmdPidFile={LAB}/run/slurmd-%n.pid
SlurmctldLogFile={LAB}/log/slurmctld.log
SlurmdLogFile={LAB}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={LAB}/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
JobCompType=jobcomp/filetxt
JobCompLoc={LAB}/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
SlurmctldTimeout=30
InactiveLimit=0
KillWait=30
MinJobAge=600
MessageTimeout=10
NodeName=node[1-4] NodeAddr=198.18.0.[11-14] CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 \
RealMemory=2000 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def test_a_node_without_gpus_declares_no_gres_at_all() -> None:
    node_line = next(line for line in render_slurm_conf(cfg(nodes=1, gpus_per_node=0, cpus_per_node=2)).splitlines()
                     if line.startswith("NodeName="))
    assert node_line == ("NodeName=node1 NodeAddr=198.18.0.11 CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 "
                         "ThreadsPerCore=1 RealMemory=2000 State=UNKNOWN")


def test_cgroup_conf_whole() -> None:
    assert render_cgroup_conf() == "CgroupPlugin=cgroup/v1\nConstrainDevices=yes\nConstrainCores=yes\n"


def test_hosts_file_whole_for_two_nodes() -> None:
    assert render_hosts(cfg(nodes=2)) == (
        "127.0.0.1 localhost\n"
        "::1 localhost ip6-localhost ip6-loopback\n"
        "198.18.0.1 slurmctl\n"
        "198.18.0.11 node1\n"
        "198.18.0.12 node2\n"
        "::ffff:127.0.0.1 localhost-ipv4-mapped\n"
        "::ffff:198.18.0.1 slurmctl-ipv4-mapped\n"
        "::ffff:198.18.0.11 node1-ipv4-mapped\n"
        "::ffff:198.18.0.12 node2-ipv4-mapped\n"
    )


def test_the_lab_folders_hold_every_path_the_config_files_name() -> None:
    c = cfg(nodes=2, gpus_per_node=2)
    assert c.subdirs() == [LAB / n for n in ("etc", "log", "run", "state", "munge", "dev", "cgtmp", "spool")] + [
        LAB / "spool" / "node1", LAB / "spool" / "node2"]
    values = conf_values(render_slurm_conf(c))
    # slurmd expands %n to its node name: the pid file `status` and `down` read is the one it writes.
    assert [c.slurmd_pid_file(i) for i in (1, 2)] == [
        Path(values["SlurmdPidFile"].replace("%n", f"node{i}")) for i in (1, 2)]
    assert c.slurmd_pid_file(2) == LAB / "run" / "slurmd-node2.pid"
    assert {Path(values["SlurmdSpoolDir"].replace("%n", f"node{i}")) for i in (1, 2)} <= set(c.subdirs())
    # the char devices `up` makes are those gres.conf's File= range names
    assert [c.gpu_device(g) for g in (0, 1)] == [LAB / "dev" / "nvidia0", LAB / "dev" / "nvidia1"]
    assert render_gres_conf(c).endswith(f"File={LAB}/dev/nvidia[0-1]\n")


def test_network_commands_whole_for_one_node() -> None:
    assert network_commands(cfg(nodes=1)) == [
        ["ip", "link", "add", "tsbr0", "type", "bridge"],
        ["ip", "link", "set", "tsbr0", "alias", str(LAB)],
        ["ip", "addr", "add", "198.18.0.1/24", "dev", "tsbr0"],
        ["ip", "link", "set", "tsbr0", "up"],
        ["ip", "ntable", "change", "name", "arp_cache", "dev", "tsbr0", "mcast_probes", "20"],
        ["ip", "netns", "add", "tsnode1"],
        ["ip", "link", "add", "tsveth1", "type", "veth", "peer", "name", "eth0", "netns", "tsnode1"],
        ["ip", "link", "set", "tsveth1", "master", "tsbr0", "up"],
        ["ip", "-n", "tsnode1", "addr", "add", "198.18.0.11/24", "dev", "eth0"],
        ["ip", "-n", "tsnode1", "link", "set", "eth0", "up"],
        ["ip", "-n", "tsnode1", "ntable", "change", "name", "arp_cache", "dev", "eth0", "mcast_probes", "20"],
        ["ip", "-n", "tsnode1", "link", "set", "lo", "up"],
    ]


def test_daemon_command_lines_whole() -> None:
    munge = f"{LAB}/munge"
    assert munged_argv(cfg()) == ["munged", "--force", f"--socket={munge}/munge.sock", f"--key-file={munge}/munge.key",
                                  f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                                  f"--seed-file={munge}/munged.seed"]
    assert slurmctld_argv(cfg()) == [
        "unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c",
        f"hostname slurmctl && mount --bind {LAB}/etc/hosts /etc/hosts && exec slurmctld -f {LAB}/etc/slurm.conf"]
    assert slurmd_argv(cfg(), 3) == [
        "nsenter", "--net=/run/netns/tsnode3", "unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c",
        f"hostname node3 && mount --bind {LAB}/etc/hosts /etc/hosts && "
        f"mount --rbind /sys/fs/cgroup {LAB}/cgtmp && mount -t sysfs sysfs /sys && "
        f"mount --move {LAB}/cgtmp /sys/fs/cgroup && exec slurmd -f {LAB}/etc/slurm.conf"]


def test_job_environ_drops_every_launcher_variable_and_keeps_lower_case_names() -> None:
    stale = {name: "1" for name in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "SLURM_NTASKS", "SBATCH_TIMELIMIT",
        "SALLOC_PARTITION", "SRUN_CPUS_PER_TASK", "TORCHELASTIC_RESTART_COUNT")}
    kept = {"rank": "a", "master_addr": "b", "torchelastic_x": "c", "srun_x": "d", "salloc_x": "e", "HOME": "/root"}
    assert job_environ(cfg(), {**stale, **kept, "PATH": "/bin"}) == {
        **kept, "PATH": "/opt/venv/bin:/bin", "SLURM_CONF": f"{LAB}/etc/slurm.conf"}


def test_job_environ_without_a_path_puts_the_project_before_debians_default() -> None:
    debian = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert job_environ(cfg(), {})["PATH"] == f"/opt/venv/bin:{debian}"


def test_state_record_whole() -> None:
    """What `down` finds on disk, readable by a person: the bridge and namespaces it will remove."""
    assert state_json(cfg(nodes=2, gpus_per_node=1, cpus_per_node=3)) == f"""\
{{
  "lab_dir": "{LAB}",
  "nodes": 2,
  "gpus_per_node": 1,
  "cpus_per_node": 3,
  "python_bin": "/opt/venv/bin",
  "bridge": "tsbr0",
  "netns": [
    "tsnode1",
    "tsnode2"
  ]
}}
"""


@pytest.mark.parametrize("kw", [{"nodes": 1}, {"nodes": 64}, {"gpus_per_node": 0}, {"gpus_per_node": 8},
                                {"cpus_per_node": 1}, {"cpus_per_node": 256}])
def test_sizes_at_their_limits_are_taken(kw: dict[str, int]) -> None:
    c = cfg(**kw)
    assert {key: getattr(c, key) for key in kw} == kw


@pytest.mark.parametrize(("kw", "text"), [
    ({"nodes": 0}, "--nodes=0 is out of range; the sandbox has 1 to 64 nodes. HINT: torchslurm sandbox up --nodes 4"),
    ({"nodes": 65}, "--nodes=65 is out of range; the sandbox has 1 to 64 nodes. HINT: torchslurm sandbox up --nodes 4"),
    ({"gpus_per_node": -1}, "--gpus-per-node=-1 is out of range; fake GPUs per node are 0 to 8. "
                            "HINT: torchslurm sandbox up --gpus-per-node 4"),
    ({"gpus_per_node": 9}, "--gpus-per-node=9 is out of range; fake GPUs per node are 0 to 8. "
                           "HINT: torchslurm sandbox up --gpus-per-node 4"),
    ({"cpus_per_node": 0}, "--cpus-per-node=0 is out of range; it must be 1 to 256. "
                           "HINT: torchslurm sandbox up --cpus-per-node 4"),
    ({"cpus_per_node": 257}, "--cpus-per-node=257 is out of range; it must be 1 to 256. "
                             "HINT: torchslurm sandbox up --cpus-per-node 4"),
])
def test_sizes_past_their_limits_are_refused_whole(kw: dict[str, int], text: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg(**kw)
    assert str(info.value) == text


@pytest.mark.parametrize(("kw", "text"), [
    ({"lab_dir": Path("relative/lab")}, "--lab-dir='relative/lab' must be an absolute path without spaces, colons "
     "or shell characters (found a relative path); Slurm config lines and PATH cannot quote them. "
     "HINT: --lab-dir /tmp/torchslurm-sandbox"),
    ({"lab_dir": Path("/tmp/a;b$")}, "--lab-dir='/tmp/a;b$' must be an absolute path without spaces, colons "
     "or shell characters (found $;); Slurm config lines and PATH cannot quote them. "
     "HINT: --lab-dir /tmp/torchslurm-sandbox"),
    # python_bin is no flag but the folder of the Python running torchslurm: the fix is another environment.
    ({"python_bin": Path("venv/bin")}, "python_bin='venv/bin' must be an absolute path without spaces, colons "
     "or shell characters (found a relative path); Slurm config lines and PATH cannot quote them. "
     "HINT: run torchslurm from a Python environment whose path is absolute and plain, "
     "e.g. python3 -m venv /opt/torchslurm-venv"),
    # a colon would split PATH, which the nodes' jobs get with python_bin first
    ({"python_bin": Path("/opt/v:1/bin")}, "python_bin='/opt/v:1/bin' must be an absolute path without spaces, "
     "colons or shell characters (found :); Slurm config lines and PATH cannot quote them. HINT: run torchslurm "
     "from a Python environment whose path is absolute and plain, e.g. python3 -m venv /opt/torchslurm-venv"),
])
def test_unusable_paths_are_refused_whole(kw: dict[str, Path], text: str) -> None:
    with pytest.raises(ConfigError) as info:
        SandboxConfig(**kw)  # type: ignore[arg-type]
    assert str(info.value) == text


def test_node_index_takes_the_first_and_last_node_only() -> None:
    assert (node_index("node1", 1), node_index("4", 4)) == (1, 4)
    for name in ("node0", "node3"):
        with pytest.raises(ConfigError) as info:
            node_index(name, 2)
        assert str(info.value) == (f"node {name!r} is not in the sandbox; valid nodes: node1, node2. "
                                   "HINT: use one of them")
